"""The logits at a prompt's last position, kept beside its cached KV: an exact re-send needs no forward.

A prompt whose every token's KV is in the prefix cache still costs one forward today: the cache
never hands out a whole prompt, because the first output token is sampled from the logits at
the last prompt position, which only a forward gives. llama.cpp keeps those logits with its
slot, so sending the same prompt again answers without touching the model. Here the step
sampler records the raw logits row (float32, on the device, before any sampling change) of
every prompt it finishes, keyed by the prompt's tokens and cache salt; the scheduler admits a
request whose whole prompt matches the cache and has such a row with no prefill at all, and
its first token is sampled from the row (runtime/step/contract.py: StepPlan.ready). Logits are a pure
function of the tokens (the weights never change under a running engine), so a kept row is
valid as long as the prompt's KV is cached, which the scheduler checks by matching the whole
prompt. Memory is bounded: the least recently used rows go first, past `max_bytes`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from runtime.lora.namespace import key_bytes

DEFAULT_MAX_BYTES = 64 << 20  # 64 rows of Gemma 3's 262,144-token vocabulary in float32


def prompt_key(prompt_ids: Sequence[int], salt: Hashable | None) -> bytes:
    """The prompt's tokens and its cache namespace (a salt, or a tagged LoRA namespace:
    runtime/lora/namespace.py), digested."""
    digest = hashlib.blake2b(np.asarray(prompt_ids, dtype=np.int64).tobytes(), digest_size=20)
    digest.update(b"\0" + key_bytes(salt))
    return digest.digest()


class LastLogits:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # prompts answered from a kept row (no forward)

    def put(self, prompt_ids: Sequence[int], salt: Hashable | None, row: torch.Tensor) -> None:
        """Keep a copy of the logits at the prompt's last position."""
        size = row.numel() * row.element_size()
        if size > self.max_bytes:
            return
        key = prompt_key(prompt_ids, salt)
        old = self._rows.pop(key, None)
        if old is not None:
            self._bytes -= old.numel() * old.element_size()
        self._rows[key] = row.detach().clone()
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, dropped = self._rows.popitem(last=False)
            self._bytes -= dropped.numel() * dropped.element_size()

    def get(self, prompt_ids: Sequence[int], salt: Hashable | None) -> torch.Tensor | None:
        key = prompt_key(prompt_ids, salt)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def clear(self) -> None:
        self._rows.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._rows)
