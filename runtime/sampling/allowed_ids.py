"""The few tokens a constrained row's grammar allows, read from its bitmask.

At most positions of a JSON schema, a regex or a tool call (keys, quotes, separators, enum values,
a tool's name) the grammar allows a handful of tokens, and the mask throws away every other
logit. Where a row allows at most `limit` tokens, the step computes its logits only at those ids
(runtime/exec/step_logits.py): for a 262k-token vocabulary (Gemma 3) the output layer is most of a
small model's step, and at such a row almost all of it is masked anyway. Inside a JSON string
nearly the whole vocabulary is allowed; such rows take the output layer as before.

The default limit, NARROW_MAX_TOKENS, from the default model on the 2-core Zen 4 (bf16 activations,
the GGUF's int8 output weight, 2026-11-25): one row at 1,024 allowed ids took 0.16 ms against 1.3
ms a row of the full output layer in a step of 104 rows (9.2 ms for one row alone); at 4,096 ids
2.0 ms, no longer a gain in a wide step. benchmarks/jump_forward.py's schema allows at most 106
tokens anywhere outside its strings, and about 255k inside them.
"""

from __future__ import annotations

import torch

NARROW_MAX_TOKENS = 1024


def allowed_ids(bitmask: torch.Tensor, rows: list[int], width: int, limit: int) -> dict[int, torch.Tensor]:
    """For each of the bitmask's `rows` that allows at most `limit` tokens, its allowed ids (int64,
    ascending, on the host), by row. bitmask: the host bitmask of runtime/sampling/grammar.py
    (xgrammar's layout: bit t % 32 of word t // 32, 1 allowed); width: the logits' vocabulary. No
    row where the bitmask covers fewer tokens than the logits: a masked full row's trailing ids
    stay unmasked, which a narrowed row would not reproduce."""
    if not rows or limit <= 0 or width > bitmask.shape[1] * 32:
        return {}
    words = bitmask.index_select(0, torch.tensor(rows, dtype=torch.int64, device="cpu"))[:, : (width + 31) // 32]
    # Every word with a bit set allows at least one token: more such words than `limit` rules a row out.
    few = [i for i, n in enumerate((words != 0).sum(1).tolist()) if n <= limit]
    if not few:
        return {}
    words = words[few]
    at, word = words.nonzero(as_tuple=True)
    shifts = torch.arange(32, dtype=words.dtype, device="cpu")
    bits = (words[at, word].unsqueeze(1) >> shifts) & 1  # [words with a bit set, 32]
    pair, bit = bits.nonzero(as_tuple=True)
    ids, owner = word[pair] * 32 + bit, at[pair]
    keep = ids < width
    ids, owner = ids[keep], owner[keep]
    counts = torch.bincount(owner, minlength=len(few)).tolist()
    return {rows[i]: part for i, part, n in zip(few, ids.split(counts), counts) if n <= limit}
