"""Retention on the host and disk tiers: which tier copies are evicted last, and for how long.

A retained prefix (runtime/kv/pins.py: `cache_control`, `retention_seconds`, a stored Responses
answer) is locked in the pool while its pin lasts. When the pool needs the room first, the pin is
let go and the prefix is demoted like any other: here it keeps its retention on the tiers below
until it expires. A tier copy is retained when its node's whole path (namespace and tokens, root
to the node's last token) lies within a retained prefix whose time is not up.

Bounded like the pool's pins: each tier evicts unretained copies first (least recently used
first), and keeps retained ones only within `RETAINED_SHARE` of its room; past that share, the
lowest priority, then the oldest, are evicted like the rest. A retention expires on its own:
an expired one simply no longer protects anything. Everything here runs under KVTiers' lock.

Retention outlives a restart with the disk tier: `saved()` gives the live retentions with their
expiry as wall-clock time, KVTiers writes them beside the files (kv_files.write_retained) and a
restarted server `load`s them back before it restores the files, so a retained prefix keeps its
deadline (not a fresh one, and not none).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from radix.tiers import StoredKey

logger = logging.getLogger(__name__)
RETAINED_SHARE = 0.25  # of each tier's room (the pool's pins hold at most a quarter of it too)
_order = itertools.count()


@dataclass
class _Retained:
    extra_key: object
    path: np.ndarray
    expires: float  # time.monotonic()
    priority: int
    order: int = field(default_factory=lambda: next(_order))
    handles: set[int] = field(default_factory=set)

    def covers(self, key: StoredKey) -> bool:
        n = len(key.path)
        return key.extra_key == self.extra_key and n <= len(self.path) and \
            bool(np.array_equal(self.path[:n], key.path))


class TierRetention:
    def __init__(self) -> None:
        self._asked: dict[str, _Retained] = {}
        self._by_handle: dict[int, set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._asked)

    def retain(self, name: str, extra_key: object, path: np.ndarray, expires: float, priority: int,
               entries: Iterable[tuple[int, StoredKey]]) -> None:
        """Retain every copy within `path` (and any stored later) until `expires`; `name` replaces
        an earlier retention of that name."""
        self.forget(name)
        self._drop_expired()
        asked = _Retained(extra_key, np.asarray(path, dtype=np.int64).reshape(-1), expires, priority)
        self._asked[name] = asked
        for handle, key in entries:
            if asked.covers(key):
                self._mark(name, asked, handle)

    def saved(self) -> list[dict[str, object]]:
        """The live retentions, JSON-able, each with its expiry as wall-clock time (time.time())."""
        self._drop_expired()
        now, wall = time.monotonic(), time.time()
        return [{"name": name, "extra_key": a.extra_key, "path": a.path.tolist(),
                 "expires_at": wall + (a.expires - now), "priority": a.priority}
                for name, a in sorted(self._asked.items(), key=lambda item: item[1].order)]

    def load(self, saved: list[dict[str, object]]) -> int:
        """Retentions from `saved()` of an earlier process (before its copies are stored again);
        those expired meanwhile, or malformed, are skipped. How many were taken."""
        now, wall = time.monotonic(), time.time()
        taken = 0
        for item in saved:
            try:
                expires = now + (float(item["expires_at"]) - wall)  # type: ignore[arg-type]
                path = np.asarray(item["path"], dtype=np.int64)
                name, priority = str(item["name"]), int(item["priority"])  # type: ignore[call-overload]
                extra_key = item["extra_key"]
            except (KeyError, TypeError, ValueError):
                logger.warning("KV disk tier: a saved retention is malformed; skipped")
                continue
            if expires > now:
                self.retain(name, extra_key, path, expires, priority, ())
                taken += 1
        return taken

    def expiry(self, handle: int) -> float | None:
        """When the latest live retention of a copy ends (time.monotonic()); None: not retained."""
        now = time.monotonic()
        ends = [self._asked[n].expires for n in self._by_handle.get(handle, ()) if self._asked[n].expires > now]
        return max(ends, default=None)

    def forget(self, name: str) -> bool:
        """End a retention; False when there was none of that name."""
        asked = self._asked.pop(name, None)
        if asked is None:
            return False
        for handle in asked.handles:
            names = self._by_handle.get(handle)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_handle[handle]
        return True

    def stored(self, handle: int, key: StoredKey) -> None:
        """A new copy: retained if a live retention covers it."""
        for name, asked in self._asked.items():
            if asked.covers(key):
                self._mark(name, asked, handle)

    def gone(self, handle: int) -> None:
        for name in self._by_handle.pop(handle, ()):
            asked = self._asked.get(name)
            if asked is not None:
                asked.handles.discard(handle)

    def protected(self, sizes: Iterable[tuple[int, int]], budget: float) -> set[int]:
        """Of the (handle, size) copies of one tier, the retained ones it keeps: highest priority,
        then newest, first, while their sizes fit in `budget`."""
        if not self._by_handle:
            return set()
        now = time.monotonic()
        ranked = []
        for handle, size in sizes:
            rank = self._rank(handle, now)
            if rank is not None:
                ranked.append((rank, handle, size))
        kept: set[int] = set()
        used = 0
        for _, handle, size in sorted(ranked, reverse=True):
            if used + size <= budget:
                kept.add(handle)
                used += size
        return kept

    def is_retained(self, handle: int) -> bool:
        return self._rank(handle, time.monotonic()) is not None

    def _rank(self, handle: int, now: float) -> tuple[int, int] | None:
        best = None
        for name in self._by_handle.get(handle, ()):
            asked = self._asked[name]
            if asked.expires > now:
                rank = (asked.priority, asked.order)
                best = rank if best is None or rank > best else best
        return best

    def _mark(self, name: str, asked: _Retained, handle: int) -> None:
        asked.handles.add(handle)
        self._by_handle.setdefault(handle, set()).add(name)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for name in [n for n, a in self._asked.items() if a.expires <= now]:
            self.forget(name)
