"""The tiers under the KV pool: host memory and a disk directory (radix/tiers.py's LowerTier).

- Host tier (`--kv-host-tier-tokens` / `--kv-host-tier-gib`): KV evicted from the pool is copied
  into host tensors, in the pool's dtype by default (so outputs are the same whichever tier a
  prefix came from) or compact (`--kv-host-tier-dtype bfloat16|int8`, runtime/kv/host_codec.py),
  least recently used dropped first. On a GPU this is RAM beside the GPU's memory; on a CPU it is
  more RAM than the pool was given.
- Disk tier (`--kv-disk-dir`, `--kv-disk-gib`): every node the tree caches is also written, by a
  background thread, to one file under `<dir>/<digest>/`, so a restarted server finds its
  prefixes. `digest` names everything that changes KV (kv_digest): another model, dtype, page
  size or tokenizer reads another folder and never these files. A file is written to a temporary
  name and renamed, and carries the SHA-256 of each block of its payload: a torn, truncated or
  flipped file is skipped (and deleted) when it is read, so its prefix is recomputed, never
  served. The header names the encoding (the host tier's dtype); a file of another encoding is never read.
- Retention (runtime/kv/tier_retention.py): copies within a retained prefix are evicted last from
  each tier, within a bounded share of it, until their retention expires. With a disk tier the
  live retentions (wall-clock expiry) are recorded in `<dir>/<digest>/retained.json`, so a
  restarted server keeps them until the same deadline.
- Prefetch: a queued request's prefix that is only on disk is read by a background thread
  (`prefetch`), so that promoting it at admission copies from memory; a load waits for a read
  already under way instead of reading twice. Prefetched copies are held (at most a pool's worth
  of tokens) until loaded, then let go: the file stays.
- A copy can be split in two (a prompt shares only the first part of a node): a written copy's
  parts stay in its file, each a run of its tokens (kv_files.DiskRun; the file goes with the last
  run), so nothing is read or written; a copy not yet written is cut in memory and each part
  written anew. After a restart such a file comes back as the whole run it was written for.
- Copies to and from the pool go through a copy engine (runtime/kv/tier_copy.py): plain copies
  on the CPU; on CUDA, pinned host memory and a copy stream whose events the next step waits on
  (`before_step`, called by the model runner before every forward).
The tree decides when KV moves (eviction demotes, a match promotes); this file only keeps copies.
The files' format and the digest are runtime/kv/kv_files.py; the writer and prefetch threads,
runtime/kv/disk_workers.py; the configuration and counters, runtime/kv/tier_config.py.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from radix.tiers import StoredKey
from runtime.kv.disk_workers import DiskWorkers
from runtime.kv.host_codec import HostCodec, HostCopy
from runtime.kv.kv_files import (
    DiskRun,
    kv_digest,
    read_kv_file,
    read_kv_key,
    read_retained,
    write_kv_file,
    write_retained,
)
from runtime.kv.pool import KVPool
from runtime.kv.tier_config import TierConfig, TierStats
from runtime.kv.tier_copy import copy_engine
from runtime.kv.tier_retention import RETAINED_SHARE, TierRetention

logger = logging.getLogger(__name__)
__all__ = ["KVTiers", "TierConfig", "TierStats", "kv_digest"]  # all but KVTiers: re-exported
MAX_QUEUED_WRITES = 256


@dataclass
class _Entry:
    key: StoredKey
    tokens: int
    host: HostCopy | None = None
    disk: DiskRun | None = None  # its tokens in a written file (a split copy's parts share one)
    writing: bool = False
    released: bool = False
    prefetch: threading.Event | None = None  # set when a background read of its file is done


class KVTiers:
    def __init__(self, pool: KVPool, config: TierConfig) -> None:
        self.pool = pool
        self.config = config
        self.stats = TierStats()
        self.codec = HostCodec(config.host_dtype, pool.dtype)
        # Pinned memory and a copy stream on CUDA, plain copies on the CPU (tier_copy.py).
        self.copies = copy_engine(pool.k[0].device, config.copy_engine)
        self.retention = TierRetention()
        self._entries: dict[int, _Entry] = {}
        self._host_lru: OrderedDict[int, None] = OrderedDict()
        self._disk_lru: OrderedDict[int, int] = OrderedDict()  # handle -> its share of its file's bytes
        self._file_refs: dict[Path, int] = {}  # a file -> the entries whose runs lie in it
        self._host_tokens = 0
        self._disk_bytes = 0
        self._dropped: list[int] = []
        self._prefetched: OrderedDict[int, int] = OrderedDict()  # handle -> tokens, read ahead from disk
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.folder: Path | None = None
        self._retained_dirty = False
        self._disk: DiskWorkers | None = None  # the writer and reader threads (disk_workers.py)
        if config.disk_dir is not None:
            self.folder = Path(config.disk_dir) / config.digest
            self.folder.mkdir(parents=True, exist_ok=True)
            self._disk = DiskWorkers(self._write, self._write_retained, self._prefetch_one)

    # -- LowerTier -------------------------------------------------------------------------------

    def store(self, key: StoredKey, slots: torch.Tensor, evicting: bool) -> object | None:
        keep_host = evicting and self.config.host_tokens >= len(slots)
        if not keep_host and (self._disk is None or self._disk.backlog() > MAX_QUEUED_WRITES):
            return None  # (a writer far behind: this prefix is not persisted, rather than RAM piling up)
        copy = self.copies.download(self.pool, slots, self.codec)
        with self._lock:
            return self._add(key, copy, keep_host)

    def demote(self, handle: object, slots: torch.Tensor) -> None:
        """A node with a disk copy leaves the pool: keep it in the host tier too, where there is
        one, so that a hit copies from memory rather than reading the file."""
        if self.config.host_tokens < len(slots):
            return
        with self._lock:
            entry = self._entries.get(handle)  # type: ignore[arg-type]
            if entry is None or handle in self._host_lru:
                return
        copy = self.copies.download(self.pool, slots, self.codec)
        with self._lock:
            if entry.released:
                return
            self._prefetched.pop(handle, None)  # type: ignore[call-overload]
            entry.host = copy
            self._host_lru[handle] = None  # type: ignore[index]
            self._host_tokens += entry.tokens
            self._fit_host()

    def load(self, handle: object, slots: torch.Tensor) -> str | None:
        with self._lock:
            entry = self._entries.get(handle)  # type: ignore[arg-type]
            pending = entry.prefetch if entry is not None else None
        if pending is not None:
            pending.wait(60)  # a read of this file is under way: use it rather than read again
        with self._lock:
            entry = self._entries.get(handle)  # type: ignore[arg-type]
            host, disk = (entry.host, entry.disk) if entry is not None else (None, None)
            if self._prefetched.pop(handle, None) is not None:  # type: ignore[call-overload]
                entry.host = None  # type: ignore[union-attr]  (read ahead for this load; the file stays)
        if host is not None:  # (a copy not in the host tier's LRU is on its way to disk)
            self._scatter(slots, host)
            self.touch(handle)
            return "host" if handle in self._host_lru else "disk"
        if disk is None:
            return None
        copy = self._read(disk)
        if copy is None:
            with self._lock:
                self.stats.corrupt += 1
                self._forget(handle)  # type: ignore[arg-type]
            return None
        self._scatter(slots, copy)
        self.stats.reads += 1
        self.touch(handle)
        return "disk"

    def release(self, handle: object) -> None:
        with self._lock:
            self._forget(handle)  # type: ignore[arg-type]

    def prefetch(self, handles: list[object]) -> int:
        """Start reading, in the background, the files of those handles that are only on disk;
        how many reads were queued."""
        if self._disk is None:
            return 0
        queued = 0
        with self._lock:
            for handle in handles:
                entry = self._entries.get(handle)  # type: ignore[arg-type]
                if entry is None or entry.host is not None or entry.disk is None or entry.prefetch is not None:
                    continue
                entry.prefetch = threading.Event()
                self._disk.read_ahead((handle, entry))
                queued += 1
        return queued

    def split(self, handle: object, n: int) -> tuple[object, object] | None:
        """Two handles for the first `n` tokens of a handle's KV and the rest, in place of it;
        None when the tier no longer has it intact. A written copy's parts stay in its file (each
        a run of its tokens: nothing is read or written); a copy not yet written is cut in memory
        and each part written anew."""
        with self._lock:
            entry = self._entries.get(handle)  # type: ignore[arg-type]
            if entry is None:
                return None
            host, disk, in_host = entry.host, entry.disk, handle in self._host_lru
            if disk is not None:
                return self._split_in_file(handle, entry, n, in_host)
        copy = host if host is not None else self._read(disk) if disk is not None else None
        with self._lock:
            if copy is None:
                self.stats.corrupt += disk is not None
                self._forget(handle)  # type: ignore[arg-type]
                return None
            self._forget(handle)  # type: ignore[arg-type]
            key = entry.key
            upper = StoredKey(key.extra_key, key.path[: key.start + n], key.start)
            lower = StoredKey(key.extra_key, key.path, key.start + n)
            return (self._add(upper, copy.slice(0, n), in_host),
                    self._add(lower, copy.slice(n, copy.tokens), in_host))

    def _split_in_file(self, handle: object, entry: _Entry, n: int, in_host: bool) -> tuple[int, int]:
        """Under the lock: the parts of a written copy, as runs of the same file (a host copy, if
        the host tier has one, is cut in two alongside)."""
        assert entry.disk is not None
        run, key = entry.disk, entry.key
        host = entry.host if in_host else None
        self._file_refs[run.path] = self._file_refs.get(run.path, 1) + 2  # the parts'; the whole's goes next
        self._forget(handle)  # type: ignore[arg-type]
        upper = StoredKey(key.extra_key, key.path[: key.start + n], key.start)
        lower = StoredKey(key.extra_key, key.path, key.start + n)
        return (self._add_run(upper, run.part(0, n), host.slice(0, n) if host is not None else None),
                self._add_run(lower, run.part(n, run.count), host.slice(n, host.tokens) if host is not None else None))

    def retain(self, name: str, extra_key: object, token_ids: object, expires: float, priority: int = 0) -> None:
        """Keep the copies within this prefix (and those stored later) last on every tier until
        `expires` (time.monotonic()); `name` replaces an earlier retention of that name."""
        with self._lock:
            self.retention.retain(name, extra_key, np.asarray(token_ids, dtype=np.int64), expires, priority,
                                  ((h, e.key) for h, e in self._entries.items()))
        self._save_retained()

    def unretain(self, name: str) -> None:
        with self._lock:
            forgotten = self.retention.forget(name)
        if forgotten:
            self._save_retained()

    def retained_until(self, handle: object) -> float | None:
        """When a copy's retention on the tiers ends (time.monotonic()); None: not retained."""
        with self._lock:
            return self.retention.expiry(handle)  # type: ignore[arg-type]

    def is_retained(self, handle: object) -> bool:
        with self._lock:
            return self.retention.is_retained(handle)  # type: ignore[arg-type]

    def touch(self, handle: object) -> None:
        with self._lock:
            if handle in self._host_lru:
                self._host_lru.move_to_end(handle)  # type: ignore[arg-type]
            if handle in self._disk_lru:
                self._disk_lru.move_to_end(handle)  # type: ignore[arg-type]

    def dropped(self) -> list[object]:
        with self._lock:
            out, self._dropped = self._dropped, []
        return out  # type: ignore[return-value]

    def restore(self) -> list[tuple[StoredKey, object]]:
        """Every intact file header of this digest's folder, oldest first (the disk bound applies)."""
        if self.folder is None:
            return []
        for tmp in self.folder.glob("*.tmp"):  # a write that never finished (the process was killed)
            tmp.unlink(missing_ok=True)
        with self._lock:  # before the copies come back, so that the retained ones are marked (and kept)
            self.retention.load(read_retained(self.folder))
        found: list[tuple[float, Path, StoredKey]] = []  # (the runs of a split copy come back whole)
        for path in self.folder.glob("*.kv"):
            key = self._read_key(path)
            if key is None:
                self.stats.corrupt += 1
                path.unlink(missing_ok=True)
                continue
            found.append((path.stat().st_mtime, path, key))
        restored = []
        with self._lock:
            for _, path, key in sorted(found, key=lambda item: item[0]):
                tokens = len(key.path) - key.start
                handle = self._add_run(key, DiskRun(path, 0, tokens, tokens, path.stat().st_size), None)
                restored.append((key, handle))
            self._fit_disk()
            restored = [(k, h) for k, h in restored if h in self._entries]
            self._dropped.clear()  # the tree never saw those
        self.stats.restored = len(restored)
        if restored:
            logger.info("KV disk tier: %d cached prefixes found in %s", len(restored), self.folder)
        return restored

    def tier_of(self, handle: object) -> str | None:
        """Where a handle's KV is now: "host", "disk", or None when the tier no longer has it."""
        with self._lock:
            entry = self._entries.get(handle)  # type: ignore[arg-type]
            if entry is None:
                return None
            if handle in self._host_lru:
                return "host"
            return "disk" if entry.disk is not None or entry.writing else None

    # -- sizes -----------------------------------------------------------------------------------

    def host_tokens(self) -> int:
        return self._host_tokens

    def disk_bytes(self) -> int:
        return self._disk_bytes

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        if self._disk is not None:
            self._disk.flush(timeout)

    def close(self) -> None:
        if self._disk is not None:
            self._disk.close()

    # -- copies ----------------------------------------------------------------------------------

    def _scatter(self, slots: torch.Tensor, copy: HostCopy) -> None:
        """Into the pool; a step reads `slots` only after `before_step` (tier_copy.py's contract)."""
        self.copies.upload(self.pool, slots, copy, self.codec)

    def before_step(self) -> None:
        """A forward step is about to run: it waits for every copy to and from the pool issued so far."""
        self.copies.before_step()

    # -- bookkeeping (under the lock) ------------------------------------------------------------

    def _add(self, key: StoredKey, copy: HostCopy, keep_host: bool) -> int:
        """A new entry holding `copy`: in the host tier's LRU with `keep_host`, queued for the
        disk where there is one (the copy is kept until written)."""
        handle = next(self._ids)
        entry = _Entry(key, copy.tokens, host=copy)
        self._entries[handle] = entry
        self.retention.stored(handle, key)
        if keep_host:
            self._host_lru[handle] = None
            self._host_tokens += entry.tokens
            self._fit_host()
        if self._disk is not None:
            entry.writing = True
            self._disk.write(handle)
        return handle

    def _forget(self, handle: int) -> None:
        entry = self._entries.pop(handle, None)
        if entry is None:
            return
        self.retention.gone(handle)
        self._prefetched.pop(handle, None)
        entry.released = True
        if handle in self._host_lru:
            del self._host_lru[handle]
            self._host_tokens -= entry.tokens
        size = self._disk_lru.pop(handle, None)
        if size is not None:
            self._disk_bytes -= size
        if entry.disk is not None:
            self._unref(entry.disk)

    def _fit_host(self) -> None:
        """Evict least recently used copies until the host tier fits: unretained ones first, and
        retained ones only past their share of the tier (tier_retention.py)."""
        cap = self.config.host_tokens
        if self._host_tokens <= cap:
            return
        keep = self.retention.protected(((h, self._entries[h].tokens) for h in self._host_lru), cap * RETAINED_SHARE)
        while self._host_tokens > cap:
            handle = _first_not_in(self._host_lru, keep)
            if handle is None:
                break
            del self._host_lru[handle]
            entry = self._entries[handle]
            self._host_tokens -= entry.tokens
            if entry.writing:
                continue  # the writer still needs the copy; it lets go of it once written
            entry.host = None
            if entry.disk is None:
                self._drop(handle)

    def _fit_disk(self) -> None:
        """The same for the disk tier's bytes."""
        cap = self.config.disk_bytes
        if self._disk_bytes <= cap:
            return
        keep = self.retention.protected(self._disk_lru.items(), cap * RETAINED_SHARE)
        while self._disk_bytes > cap:
            handle = _first_not_in(self._disk_lru, keep)
            if handle is None:
                break
            self._disk_bytes -= self._disk_lru.pop(handle)
            entry = self._entries[handle]
            if self._prefetched.pop(handle, None) is not None:
                entry.host = None
            if entry.disk is not None:
                self._unref(entry.disk)
                entry.disk = None
            if entry.host is None:
                self._drop(handle)

    def _add_run(self, key: StoredKey, run: DiskRun, host: HostCopy | None) -> int:
        """A new entry for a run of a file already written (its reference counted by the caller;
        a restored file's one reference is this entry's), with a host copy in the host tier's LRU."""
        handle = next(self._ids)
        self._entries[handle] = _Entry(key, run.count, host=host, disk=run)
        self._file_refs.setdefault(run.path, 1)
        self.retention.stored(handle, key)
        if host is not None:
            self._host_lru[handle] = None
            self._host_tokens += run.count
        self._disk_lru[handle] = run.share
        self._disk_bytes += run.share
        return handle

    def _unref(self, run: DiskRun) -> None:
        """An entry no longer uses its run of a file: the file goes with the last of them. (Until
        then the file's bytes stay on disk though the tier counts only its live runs' shares.)"""
        refs = self._file_refs.pop(run.path, 1) - 1
        if refs > 0:
            self._file_refs[run.path] = refs
        else:
            run.path.unlink(missing_ok=True)

    def _drop(self, handle: int) -> None:
        """The tier lets go of a handle on its own; the tree hears of it through dropped()."""
        self._entries.pop(handle)
        self.retention.gone(handle)
        self._dropped.append(handle)

    # -- the disk (run by the threads of disk_workers.py) ----------------------------------------

    def _prefetch_one(self, item: object) -> None:
        """Read a queued prefetch's file into a held host copy, and wake a load waiting for it."""
        handle, entry = item  # type: ignore[misc]
        with self._lock:
            run = None if entry.released else entry.disk
        try:  # (a damaged file goes here as on a load; the load then finds it gone)
            copy = self._read(run) if run is not None else None
        except Exception:  # noqa: BLE001 - a failed read ahead only costs the load its own read
            logger.exception("KV disk tier: a prefetch failed")
            copy = None
        with self._lock:
            if copy is not None and not entry.released and entry.host is None and entry.disk is not None:
                entry.host = copy
                self._prefetched[handle] = entry.tokens
                self.stats.prefetched += 1
                while sum(self._prefetched.values()) > self.pool.num_slots:  # at most a pool's worth
                    oldest, _ = self._prefetched.popitem(last=False)
                    self._entries[oldest].host = None
            event, entry.prefetch = entry.prefetch, None
        if event is not None:
            event.set()

    def _write(self, handle: int) -> None:
        with self._lock:
            entry = self._entries.get(handle)
            if entry is None or entry.host is None:
                return
            key, copy = entry.key, entry.host
        assert self.folder is not None
        run = write_kv_file(self.folder, self.config.digest, key, self.codec.name, copy)
        size = run.share
        with self._lock:
            entry.writing = False
            if entry.released:
                run.path.unlink(missing_ok=True)
                return
            entry.disk = run
            self._file_refs[run.path] = 1
            if handle not in self._host_lru:
                entry.host = None  # kept only for the write
            self._disk_lru[handle] = size
            self._disk_bytes += size
            self.stats.writes += 1
            self.stats.write_bytes += size
            self._fit_disk()

    def _save_retained(self) -> None:
        """Have the writer record the live retentions beside the files (a restart keeps them)."""
        if self._disk is not None and not self._retained_dirty:
            self._retained_dirty = True  # (several changes before the writer gets to it: one write)
            self._disk.save_retained()

    def _write_retained(self) -> None:
        with self._lock:
            self._retained_dirty = False
            saved = self.retention.saved()
        assert self.folder is not None
        try:
            write_retained(self.folder, saved)
        except (OSError, TypeError, ValueError):  # (a namespace JSON cannot hold: not kept past a restart)
            logger.exception("KV disk tier: the retentions could not be saved")

    def _read_key(self, path: Path) -> StoredKey | None:
        return read_kv_key(path, self.config.digest, self.codec.name)

    def _read(self, run: DiskRun) -> HostCopy | None:
        return read_kv_file(run.path, self.codec, run.first, run.count)


def _first_not_in(lru: OrderedDict[int, object], keep: set[int]) -> int | None:
    """The least recently used handle not kept (past the few kept ones at the front)."""
    return next((h for h in lru if h not in keep), None)
