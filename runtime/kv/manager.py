"""Cache bookkeeping for requests: match a prefix, grow a request's slots, hand KV to the prefix cache.

Every slot is in exactly one place: free in the allocator, held by the prefix cache, or held by
a running request (its table row from `locked_len` up to `allocated`). The manager owns the
pool, the table, the allocator and the cache (built together by runtime/kv/build.py), and its
methods are the only code that moves slots between those places or writes a request's KV fields
(`row`, `kv_len`, `allocated`, `locked_len`, `locked_node`).
"""

from __future__ import annotations

import torch

from radix import BasePrefixCache, SlotAllocator
from runtime.kv.last_logits import LastLogits
from runtime.kv.pins import PrefixPins
from runtime.kv.pool import KVPool
from runtime.kv.slot_table import ReqSlotTable
from runtime.kv.tiers import KVTiers
from runtime.step.request import Req


class KVManager:
    def __init__(self, pool: KVPool, table: ReqSlotTable, allocator: SlotAllocator, cache: BasePrefixCache,
                 tiers: KVTiers | None = None) -> None:
        self.pool = pool
        self.table = table
        self.allocator = allocator
        self.cache = cache
        self.tiers = tiers  # host and disk copies under the cache (None: the pool alone)
        self.page = allocator.page_size
        # The last logits of finished prompts, so an exact re-send needs no forward (last_logits.py).
        self.last_logits = LastLogits()
        # Prefixes retained for a while (runtime/kv/pins.py): at most a quarter of the pool, and
        # released before a running request is retracted or failed; retained on the tiers too.
        self.pins = PrefixPins(cache, max_tokens=allocator.num_slots // 4, lower=tiers)

    # -- sizes -------------------------------------------------------------------------------------

    def room(self) -> int:
        """Slots obtainable now: free ones plus cached ones nobody has locked."""
        return self.allocator.available() + self.cache.evictable_size()

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    # -- admission ---------------------------------------------------------------------------------

    def promote(self, req: Req) -> int:
        """Bring the request's prefix back from the lower tiers into the pool, where it was demoted."""
        if self.tiers is None:
            return 0
        return self.cache.promote(req.all_ids[: req.max_prefix_match()], req.extra_key, self.alloc)

    def before_step(self) -> None:
        """A forward step is about to run: it must not read promoted slots, or write demoted
        ones, before their copies are done (runtime/kv/tier_copy.py)."""
        if self.tiers is not None:
            self.tiers.before_step()

    def prefetch(self, req: Req) -> None:
        """A request was queued: start reading, in the background, what of its prefix is only on
        disk, so that promoting it at admission finds it in memory."""
        if self.tiers is not None and self.tiers.folder is not None:
            self.tiers.prefetch(self.cache.demoted_on_path(req.all_ids[: req.max_prefix_match()], req.extra_key))

    def close(self) -> None:
        """Finish the disk tier's writes (the engine is shutting down)."""
        if self.tiers is not None:
            self.tiers.close()

    def admit(self, req: Req, prefix: torch.Tensor, node: object) -> None:
        """Give a waiting request a table row holding its (already locked) cached prefix. The lock
        is the request's from the first line on, so `discard` gives it back whatever fails here."""
        req.locked_node = node
        req.row = self.table.alloc_row()
        self.table.write(req.row, 0, prefix)
        req.kv_len = req.allocated = req.locked_len = len(prefix)

    def grow(self, req: Req, new_len: int) -> bool:
        """Make room for `new_len` tokens of KV in the request's row, evicting cache leaves if needed."""
        need = self.pages_for(new_len) - req.allocated
        if need <= 0:
            return True
        slots = self.alloc(need)
        while slots is None and self.pins.release_oldest():
            slots = self.alloc(need)
        if slots is None:
            return False
        assert req.row is not None
        self.table.write(req.row, req.allocated, slots)
        req.allocated += need
        return True

    def grow_decodes(self, reqs: list[Req], drafts: dict[Req, list[int]] | None = None) -> bool:
        """Room for one more token of KV for each of `reqs` (and its draft's, if it has one), in one
        allocation and one table write. All or nothing: False, with nothing changed, when they do
        not all fit."""
        drafts = drafts or {}
        needs = [self.pages_for(r.kv_len + 1 + len(drafts.get(r, ()))) - r.allocated for r in reqs]
        total = sum(n for n in needs if n > 0)
        if total == 0:
            return True
        slots = self.alloc(total)
        if slots is None:
            return False
        rows: list[int] = []
        columns: list[int] = []
        for req, n in zip(reqs, needs):
            if n > 0:
                assert req.row is not None
                rows.extend([req.row] * n)
                columns.extend(range(req.allocated, req.allocated + n))
                req.allocated += n
        self.table.write_scattered(rows, columns, slots)
        return True

    def alloc(self, n: int) -> torch.Tensor | None:
        if self.allocator.available() < n:
            self.cache.evict(n - self.allocator.available())
        return self.allocator.alloc(n)

    def computed(self, req: Req, num_tokens: int) -> None:
        """A launched step wrote `num_tokens` more of the request's KV into its slots. A request
        that let go of its slots meanwhile (finished, or retracted while the step ran) keeps none."""
        if req.row is None:
            return
        req.kv_len += num_tokens
        assert req.kv_len <= req.allocated, "KV written past the slots a request holds"

    def verified(self, req: Req, kept: int) -> None:
        """A draft was verified: KV is kept for the first `kept` tokens; the slots past them go back."""
        assert req.row is not None and kept <= req.kv_len
        req.kv_len = kept
        keep = max(self.pages_for(kept), req.locked_len)
        if keep < req.allocated:
            self.allocator.free(self.table.read(req.row, req.allocated)[keep:].clone())
            req.allocated = keep

    # -- handing KV to the cache -------------------------------------------------------------------

    def cache_unfinished(self, req: Req) -> None:
        """Share a running request's computed prefix now (others with the same prompt hit it)."""
        if not self.cache.shares or req.row is None:
            return
        ids = req.all_ids[: req.kv_len]
        slots = self.table.read(req.row, req.kv_len)
        k = self.cache.insert(ids, slots, req.extra_key)
        if k > req.locked_len:
            # The cache already had tokens [locked_len, k): use its slots, free our duplicates.
            self.allocator.free(slots[req.locked_len : k].clone())
        match = self.cache.match_prefix(ids, req.extra_key)
        self.table.write(req.row, 0, match.indices)
        self.cache.lock(match.node)
        self.cache.unlock(req.locked_node)
        req.locked_node, req.locked_len = match.node, len(match.indices)

    def release(self, req: Req) -> None:
        """A request leaves the running set (finished, aborted or retracted): cache its KV, free the rest.

        The cache takes the whole pages of computed KV (a cache that shares nothing frees them at
        once); the request frees its duplicates of what the cache already had, and the rest.
        """
        if req.row is None:
            return
        slots = self.table.read(req.row, req.allocated).clone()
        # (a request that stopped inside a verified draft has KV for tokens it did not keep)
        keep = min(req.kv_len, req.seq_len) // self.page * self.page
        k = self.cache.insert(req.all_ids[:keep], slots[:keep], req.extra_key)
        self.allocator.free(slots[req.locked_len : max(k, req.locked_len)])
        self.allocator.free(slots[keep:])
        self.cache.unlock(req.locked_node)
        self.table.free_row(req.row)
        req.row, req.locked_node = None, None
        req.kv_len = req.allocated = req.locked_len = 0

    def discard(self, req: Req) -> None:
        """Give back everything a request holds and cache nothing of it: its table row, its own
        slots, its lock on the cached prefix. For a request that faulted (runtime/step/scheduler.py:
        `Scheduler._planning`), at any point of its bookkeeping: its tokens or state may be what is
        wrong, so unlike `release` this never walks the tree with them."""
        if req.row is not None:
            self.allocator.free(self.table.read(req.row, req.allocated)[req.locked_len :].clone())
            self.table.free_row(req.row)
        if req.locked_node is not None:
            self.cache.unlock(req.locked_node)
        req.row, req.locked_node = None, None
        req.kv_len = req.allocated = req.locked_len = 0
