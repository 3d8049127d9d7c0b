"""Draft-free speculative decoding: prompt lookup (n-gram) drafts, verified in one forward.

RAG answers quote their documents, agents repeat tool output and code, edits copy their input:
the next tokens are often already in the request's own prompt or output. For a decoding
request, the longest recent n-gram (`ngram_max` down to `ngram_min` tokens) that also occurs
earlier in its tokens proposes the tokens that followed that earlier occurrence, up to
`num_draft_tokens`. The step then computes the request's last token and the draft together (one
extend, logits at every position) and keeps the draft's longest prefix that the model itself
would have chosen, plus the model's own next token: 1 to k+1 tokens for about the weight reads
of one. Rejected positions' KV slots go back at once (KVManager.verified).

Greedy requests only, for now: their output is token for token what decoding one at a time
gives. Requests that sample, or whose next token depends on more than the logits (a grammar,
penalties, logit bias, min_new_tokens, logprobs), decode one token at a time as before, as
does any request with `speculative: false` in its sampling parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.request import Req
from runtime.sampler import has_penalty


@dataclass(frozen=True)
class SpeculativeConfig:
    num_draft_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 3


def propose(tokens: list[int], config: SpeculativeConfig) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the longest matching suffix."""
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(config.ngram_max, len(seq) - 1), config.ngram_min - 1, -1):
        suffix = seq[-n:]
        # start positions i < len - n with seq[i:i+n] == suffix (the suffix itself excluded)
        candidates = np.flatnonzero(seq[: len(seq) - n] == suffix[0])
        for i in candidates[::-1]:
            if i + n < len(seq) and np.array_equal(seq[i : i + n], suffix):
                draft = seq[i + n : i + n + config.num_draft_tokens]
                if len(draft):
                    return draft.tolist()
    return []


def may_speculate(req: Req) -> bool:
    """Whether a decoding request's next tokens depend on its logits alone, greedily."""
    p = req.params
    return (p.speculative and p.greedy and req.grammar is None and not p.return_logprob and not has_penalty(p)
            and not p.logit_bias and len(req.output_ids) >= p.min_new_tokens and not req.inflight)


def accepted(draft: list[int], targets: list[int]) -> int:
    """How many leading draft tokens the model chose too (targets[i]: its choice after draft[:i])."""
    n = 0
    while n < len(draft) and targets[n] == draft[n]:
        n += 1
    return n
