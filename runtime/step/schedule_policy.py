"""The order in which waiting requests are admitted.

- `fcfs`: arrival order.
- `lpm`: longest cached prefix first (most reuse before the cache changes); past a queue length
  the matching costs more than it earns and it falls back to fcfs.
- `dfs-weight`: walk the radix tree depth first, heavier subtrees (more waiting requests) first,
  so requests sharing a prefix run back to back.
In-batch prefix dedupe: when several waiting requests share a prefix that is not cached yet
(at least IN_BATCH_CHECK_THRESHOLD tokens beyond what is cached), only the first is admitted
this round; the others wait one round and then hit the cache. Checked at every depth, so
requests sharing a cached system prompt and an uncached document still share the document.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from radix import RadixCache, SlotAllocator, TreeNode
from radix.base import BasePrefixCache
from runtime.step.request import Req

# A request waits a round when another request of its round will compute at least this many more
# of its prefix tokens than the cache already holds.
IN_BATCH_CHECK_THRESHOLD = 32


@dataclass(slots=True)
class Candidate:
    req: Req
    prefix: torch.Tensor  # slots of its cached prefix
    node: object
    deprioritized: bool = False


class SchedulePolicy:
    def __init__(self, policy: str, cache: BasePrefixCache, fallback_queue_len: int, page_size: int) -> None:
        self.policy = policy
        self.cache = cache
        self.fallback_queue_len = fallback_queue_len
        self.page_size = page_size

    def order(self, waiting: list[Req],
              guard: Callable[[Req], AbstractContextManager[object]] | None = None) -> list[Candidate]:
        """The waiting requests in admission order, each with its cached prefix. `guard(req)` wraps
        each request's match: the scheduler's per-request seam (Scheduler._planning), which fails a
        request whose match raises; that request is left out of the order."""
        candidates: list[Candidate] = []
        for req in waiting:
            with guard(req) if guard is not None else nullcontext():
                candidates.append(self._match(req))
        policy = self.policy
        if policy == "lpm" and len(waiting) > self.fallback_queue_len:
            policy = "fcfs"
        if policy == "fcfs":
            return candidates
        self._dedupe(candidates)
        if policy == "lpm":
            candidates.sort(key=lambda c: (c.deprioritized, -len(c.prefix), c.req.arrival))
            return candidates
        return self._dfs_weight(candidates)

    def _match(self, req: Req) -> Candidate:
        ids = req.all_ids[: req.max_prefix_match()]
        match = self.cache.match_prefix(ids, req.extra_key)
        return Candidate(req, match.indices, match.node)

    def _dedupe(self, candidates: list[Candidate]) -> None:
        """Mark requests whose uncached prefix an earlier waiting request will compute this round."""
        pending = RadixCache(SlotAllocator(self.page_size, self.page_size), self.page_size)
        for cand in sorted(candidates, key=lambda c: c.req.arrival):
            ids = cand.req.all_ids[: cand.req.max_prefix_match()]
            uncached = len(ids) // self.page_size * self.page_size - len(cand.prefix)
            threshold = min(IN_BATCH_CHECK_THRESHOLD, uncached)
            if threshold <= 0:
                continue
            shared = len(pending.match_prefix(ids, cand.req.extra_key).indices)
            if shared - len(cand.prefix) >= threshold:
                cand.deprioritized = True
            else:
                # Slot values are irrelevant here: this tree only records which prefixes are coming.
                pending.insert(ids, torch.zeros(len(ids), dtype=torch.int64), cand.req.extra_key)

    def _dfs_weight(self, candidates: list[Candidate]) -> list[Candidate]:
        by_node: dict[object, list[Candidate]] = defaultdict(list)
        weight: dict[object, int] = defaultdict(int)
        roots: list[object] = []
        for cand in candidates:
            by_node[cand.node].append(cand)
            node = cand.node
            while isinstance(node, TreeNode):
                weight[node] += 1
                if node.parent is None:
                    if node not in roots:
                        roots.append(node)
                    break
                node = node.parent
        if not roots:  # no tree (prefix cache off): fcfs
            return sorted(candidates, key=lambda c: (c.deprioritized, c.req.arrival))
        ordered: list[Candidate] = []
        stack = sorted(roots, key=lambda n: weight[n])
        while stack:
            node = stack.pop()
            ordered.extend(sorted(by_node.get(node, []), key=lambda c: c.req.arrival))
            children = [c for c in node.children.values() if weight.get(c)]  # type: ignore[attr-defined]
            stack.extend(sorted(children, key=lambda n: weight[n]))  # heaviest popped first
        ordered.sort(key=lambda c: c.deprioritized)  # stable: dedupe still waits a round
        return ordered
