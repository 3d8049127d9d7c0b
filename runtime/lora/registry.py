"""The engine's LoRA adapters: which names it knows, which are held in memory, and who is using them.

- `load(name, path)` reads and checks an adapter (runtime/lora/adapter.py) and holds it; a name is
  loaded once (unload it first to load other weights under it: a new identity, a new cache namespace).
- At most `max_loaded` adapters are held at a time: loading past that drops the least recently used
  one nobody is using. Its name stays known, so a later request naming it reads it back from its
  folder, provided its files still have the digest it was loaded with.
- `acquire(name)` hands a request the adapter and counts it as a user until `release()` (the loop
  releases a request's adapter when the request ends, however it ends). An adapter with users is
  never dropped for room, and `unload` takes the name away at once while the requests already
  running keep theirs to the end: nothing is ever unloaded under a running request.
Safe to call from any thread (one lock; reading an adapter's files happens under it, and is rare).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runtime.lora.adapter import AdapterIdentity, AdapterWeights, Target, check_name, read_adapter

logger = logging.getLogger(__name__)


class AdapterNotFound(LookupError):
    """No adapter of that name is loaded (the server answers 404)."""


class AdapterBusy(RuntimeError):
    """Every held adapter is in use, so no other can be held now (the server answers 503)."""


@dataclass(eq=False)
class LoadedAdapter:
    """An adapter held in memory; a request holds it from submission to its end."""

    weights: AdapterWeights
    users: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def identity(self) -> AdapterIdentity:
        return self.weights.identity

    @property
    def name(self) -> str:
        return self.weights.identity.name

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            assert self.users >= 0, f"adapter {self.name!r} released more often than acquired"


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: str
    digest: str
    rank: int
    loaded: bool  # held in memory now (else read back on its next request)
    users: int


class LoraRegistry:
    def __init__(self, targets: dict[str, Target], dtype: torch.dtype, device: torch.device,
                 max_loaded: int | None = None) -> None:
        self.targets, self.dtype, self.device = targets, dtype, device
        self.max_loaded = max_loaded
        self._lock = threading.RLock()
        self._known: dict[str, tuple[Path, AdapterIdentity, int]] = {}  # name -> (folder, identity, rank)
        self._held: OrderedDict[str, LoadedAdapter] = OrderedDict()  # least recently used first
        self.loads = 0  # reads of adapter files (first loads and reads after being dropped)
        self.evictions = 0

    def load(self, name: str, path: str | Path) -> AdapterIdentity:
        check_name(name)
        with self._lock:
            if name in self._known:
                raise ValueError(f"lora_name: an adapter named {name!r} is already loaded; unload it first to "
                                 "load other weights under that name")
            self._make_room(name)
            weights = read_adapter(name, path, self.targets, self.dtype, self.device)
            self._held[name] = LoadedAdapter(weights)
            self._known[name] = (Path(path), weights.identity, weights.rank)
            self.loads += 1
            logger.info("LoRA adapter %r loaded from %s (rank %d, %d modules, digest %s)", name, path,
                        weights.rank, len(weights.layers), weights.identity.digest[:12])
            return weights.identity

    def unload(self, name: str) -> AdapterIdentity:
        """Forget `name`: new requests can no longer name it; those running keep it to their end."""
        with self._lock:
            if name not in self._known:
                raise AdapterNotFound(f"lora_name: no adapter named {name!r} is loaded")
            _, identity, _ = self._known.pop(name)
            self._held.pop(name, None)
            logger.info("LoRA adapter %r unloaded", name)
            return identity

    def acquire(self, name: str) -> LoadedAdapter:
        """The adapter `name`, counted as used until its `release()`; read back from its folder if it
        was dropped for room. AdapterNotFound for an unknown name; AdapterBusy when no room can be made;
        ValueError when its files changed."""
        with self._lock:
            known = self._known.get(name)
            if known is None:
                raise AdapterNotFound(f"no LoRA adapter named {name!r} is loaded (loaded: {sorted(self._known)})")
            held = self._held.get(name)
            if held is None:  # dropped for room earlier: read it back, as the same identity only
                path, identity, _ = known
                self._make_room(name)
                held = LoadedAdapter(read_adapter(name, path, self.targets, self.dtype, self.device, identity.digest))
                self._held[name] = held
                self.loads += 1
            self._held.move_to_end(name)
            with held._lock:
                held.users += 1
            return held

    def _make_room(self, name: str) -> None:
        """Drop least recently used idle adapters until one more fits."""
        if self.max_loaded is None:
            return
        while len(self._held) >= self.max_loaded:
            idle = next((n for n, a in self._held.items() if a.users == 0), None)
            if idle is None:
                raise AdapterBusy(f"cannot hold LoRA adapter {name!r}: all {self.max_loaded} held adapters "
                                 "(--max-loaded-loras) are in use; try again when requests finish")
            del self._held[idle]
            self.evictions += 1
            logger.info("LoRA adapter %r dropped from memory for room (least recently used)", idle)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._known)

    def identity(self, name: str) -> AdapterIdentity | None:
        with self._lock:
            known = self._known.get(name)
            return known[1] if known else None

    def describe(self) -> list[AdapterInfo]:
        with self._lock:
            return [AdapterInfo(name, str(path), identity.digest, rank, name in self._held,
                                self._held[name].users if name in self._held else 0)
                    for name, (path, identity, rank) in self._known.items()]

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)
