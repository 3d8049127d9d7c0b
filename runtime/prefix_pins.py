"""Prefixes kept in the prefix cache for a while: a finished conversation's KV, held for its next turn.

A stored Responses API answer (server/responses_api.py) pins its conversation's token ids (prompt +
output) here, so the next turn, whose prompt starts with those very ids, finds them cached even
if other traffic would have evicted them. A pin is a lock on the radix node of the longest cached
prefix of those ids, with an expiry.

Bounded three ways, so pins never starve live requests: each expires (`ttl_s`); all pins together
hold at most `max_tokens` (the oldest go first); and when a waiting request cannot fit with
nothing running, the loop drops pins (oldest first) before it would fail the request.
Everything here runs on the engine loop's thread (Engine.pin_prefix / unpin_prefix post to it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from radix.base import BasePrefixCache


@dataclass
class Pin:
    node: object
    tokens: int
    expires: float


class PrefixPins:
    def __init__(self, cache: BasePrefixCache, max_tokens: int) -> None:
        self.cache = cache
        self.max_tokens = max_tokens
        self._pins: OrderedDict[str, Pin] = OrderedDict()  # oldest first
        self.tokens = 0  # summed over pins (shared prefixes count once per pin)
        self._next_expiry = float("inf")

    def pin(self, key: str, token_ids: Sequence[int], ttl_s: float, extra_key: str | None = None) -> int:
        """Lock the cached prefix of `token_ids` for `ttl_s` seconds; returns how many tokens it holds."""
        self.unpin(key)
        if not getattr(self.cache, "shares", True) or ttl_s <= 0:
            return 0
        match = self.cache.match_prefix(token_ids, extra_key)
        tokens = len(match.indices)
        if tokens == 0 or tokens > self.max_tokens:
            return 0
        while self._pins and self.tokens + tokens > self.max_tokens:
            self.unpin(next(iter(self._pins)))
        self.cache.lock(match.node)
        expires = time.monotonic() + ttl_s
        self._pins[key] = Pin(match.node, tokens, expires)
        self.tokens += tokens
        self._next_expiry = min(self._next_expiry, expires)
        return tokens

    def unpin(self, key: str) -> None:
        pin = self._pins.pop(key, None)
        if pin is not None:
            self.cache.unlock(pin.node)
            self.tokens -= pin.tokens

    def expire(self) -> None:
        """Drop the pins whose time is up (cheap when none is: one comparison)."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        for key in [k for k, p in self._pins.items() if p.expires <= now]:
            self.unpin(key)
        self._next_expiry = min((p.expires for p in self._pins.values()), default=float("inf"))

    def release_oldest(self) -> bool:
        """Drop the oldest pin (room for a request that cannot fit otherwise); False when none is left."""
        if not self._pins:
            return False
        self.unpin(next(iter(self._pins)))
        return True

    def release_all(self) -> None:
        for key in list(self._pins):
            self.unpin(key)
        self._next_expiry = float("inf")

    def __len__(self) -> int:
        return len(self._pins)
