"""Prefixes kept in the prefix cache for a while: retained prompts and finished conversations.

Two users: a stored Responses API answer (server/responses/routes.py) pins its conversation's token
ids (prompt + output) for its next turn, and a request that asks for retention (`cache_control`
on a chat message, `retention_seconds` on /generate) pins its prompt's prefix. A pin is a lock on
the radix node of the longest cached prefix of those ids, with an expiry and a priority; pinning
the same ids again under the same key refreshes it.

Retention, not hard pinning: pinned prefixes are evicted last. LRU eviction skips them (they are
locked), and when nothing else is left to evict — a running request cannot grow (KVManager.grow,
which owns the pins, releases one), or a waiting request cannot fit with nothing running — pins are
released, lowest priority first and oldest first within a priority, before a request would be
retracted or failed. Bounded so they never starve live requests: each expires
(`ttl_s`); all pins together hold at most `max_tokens` (a quarter of the pool), and a new pin
pushes out pins of no higher priority to fit, or is refused.
With host and disk tiers (`lower`), a pin is also a retention there (runtime/kv/tier_retention.py):
a pin let go early for room, or pushed out, leaves its prefix demoted but evicted last from each
tier until the pin's own expiry; `unpin` and `release_all` end that too.
Everything here runs on the engine loop's thread (Engine.pin_prefix / unpin_prefix post to it).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from radix.base import BasePrefixCache
from runtime.kv.tiers import KVTiers

_order = itertools.count()


@dataclass
class Pin:
    node: object
    tokens: int
    expires: float  # time.monotonic()
    priority: int = 0
    order: int = field(default_factory=lambda: next(_order))  # creation order: older pins go first

    @property
    def rank(self) -> tuple[int, int]:
        """Release order: the lowest priority first, then the oldest."""
        return (self.priority, self.order)


class PrefixPins:
    def __init__(self, cache: BasePrefixCache, max_tokens: int, lower: KVTiers | None = None) -> None:
        self.cache = cache
        self.lower = lower
        self.max_tokens = max_tokens
        self._pins: dict[str, Pin] = {}
        self.tokens = 0  # summed over pins (shared prefixes count once per pin)
        self.released = 0  # pins let go early: pushed out by the bound or by a request that needed room
        self._next_expiry = float("inf")

    def pin(self, key: str, token_ids: Sequence[int], ttl_s: float, extra_key: str | None = None,
            priority: int = 0) -> int:
        """Lock the cached prefix of `token_ids` for `ttl_s` seconds; returns how many tokens it holds
        (0: nothing cached, or it does not fit beside pins of a higher priority)."""
        self.unpin(key)
        if not getattr(self.cache, "shares", True) or ttl_s <= 0:
            return 0
        match = self.cache.match_prefix(token_ids, extra_key)
        tokens = len(match.indices)
        if tokens == 0 or tokens > self.max_tokens:
            return 0
        lower = sorted((p.rank, k) for k, p in self._pins.items() if p.priority <= priority)
        room = self.max_tokens - self.tokens + sum(self._pins[k].tokens for _, k in lower)
        if tokens > room:
            return 0  # the higher-priority pins already fill the share
        for _, victim in lower:
            if self.tokens + tokens <= self.max_tokens:
                break
            self._drop(victim)
        self.cache.lock(match.node)
        expires = time.monotonic() + ttl_s
        self._pins[key] = Pin(match.node, tokens, expires, priority)
        self.tokens += tokens
        self._next_expiry = min(self._next_expiry, expires)
        if self.lower is not None:
            self.lower.retain(key, extra_key, list(token_ids)[:tokens], expires, priority)
        return tokens

    def unpin(self, key: str) -> None:
        """End a pin and its retention on the tiers below."""
        self._unlock(key)
        if self.lower is not None:
            self.lower.unretain(key)

    def _unlock(self, key: str) -> None:
        """Let the pool evict the prefix again (its retention on the tiers below stays until it expires)."""
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
        """Drop the first pin in release order (room for a request that cannot fit otherwise);
        False when none is left."""
        if not self._pins:
            return False
        self._drop(min(self._pins, key=lambda k: self._pins[k].rank))
        return True

    def release_all(self) -> None:
        for key in list(self._pins):
            self.unpin(key)
        self._next_expiry = float("inf")

    def retained(self) -> dict[object, float]:
        """Pinned node -> its latest expiry (time.monotonic()), for the live view."""
        out: dict[object, float] = {}
        for pin in self._pins.values():
            out[pin.node] = max(out.get(pin.node, 0.0), pin.expires)
        return out

    def summary(self) -> dict[str, int]:
        return {"pins": len(self._pins), "tokens": self.tokens, "max_tokens": self.max_tokens,
                "released": self.released}

    def _drop(self, key: str) -> None:
        self._unlock(key)
        self.released += 1

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, key: object) -> bool:
        return key in self._pins
