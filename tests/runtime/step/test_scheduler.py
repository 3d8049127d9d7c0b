"""The scheduler and the KV manager on their own (tests/runtime/fake_step.py: no model, a fake
forward): admission under the token budgets, chunked prefill, decode room, retraction order,
the LPM and DFS-weight orders, and where every KV slot is after each step."""

from __future__ import annotations

import pytest

from runtime.step.request import ReqState
from tests.runtime.fake_step import TOKEN, Harness

SYSTEM = list(range(100, 140))  # a 40-token shared prefix


def test_a_long_prompt_is_chunked_and_decodes_ride_along() -> None:
    h = Harness.make(slots=256, chunked_prefill_size=8, max_prefill_tokens=8)
    short = h.submit([1, 2, 3], max_new_tokens=5)
    plan = h.step()
    assert [len(e.token_ids) for e in plan.entries] == [3]
    long = h.submit(list(range(10, 30)), max_new_tokens=2)  # 20 tokens: chunks of 8, 8, 4
    sizes = []
    while long.state is not ReqState.FINISHED:
        plan = h.step()
        sizes.append(sorted(len(e.token_ids) for e in plan.entries))
    # the short request decodes one token in every step while the long one is prefilled in chunks
    assert sizes[:3] == [[1, 8], [1, 8], [1, 4]]
    h.run()
    assert short.output_ids == [TOKEN] * 5 and long.output_ids == [TOKEN] * 2


def test_the_prefill_budget_bounds_admission_per_step() -> None:
    h = Harness.make(slots=512, chunked_prefill_size=64, max_prefill_tokens=16)
    reqs = [h.submit(list(range(i * 10, i * 10 + 6)), max_new_tokens=1) for i in range(5)]
    plan = h.step()
    # 6 + 6 tokens fit in 16, the third gets the 4 left over as its first chunk
    assert [len(e.token_ids) for e in plan.entries] == [6, 6, 4]
    h.run()
    assert all(r.finish_reason == "length" for r in reqs)


def test_slots_all_come_back_and_the_prompt_is_cached() -> None:
    h = Harness.make(slots=128, page_size=4)
    first = h.submit(SYSTEM + [1, 2, 3], max_new_tokens=3)
    h.run()
    assert h.kv.allocator.available() + h.kv.cache.total_size() == 128
    assert h.kv.cache.protected_size() == 0  # nothing locked once nothing runs
    second = h.submit(SYSTEM + [9, 9], max_new_tokens=1)
    h.run()
    assert second.cached_tokens == len(SYSTEM)  # whole pages of the shared prefix
    assert first.output_ids == [TOKEN] * 3


def test_without_a_prefix_cache_every_slot_is_freed() -> None:
    h = Harness.make(slots=64, prefix_cache=False)
    for i in range(3):
        h.submit(SYSTEM[:10] + [i], max_new_tokens=4)
    h.run()
    assert h.kv.allocator.available() == 64 and h.kv.cache.total_size() == 0
    again = h.submit(SYSTEM[:10] + [0], max_new_tokens=1)
    h.run()
    assert again.cached_tokens == 0


def test_decode_room_runs_out_and_the_newest_request_is_retracted() -> None:
    # 3 requests of 8 prompt tokens decoding 20 each need 3 x 28 = 84 slots; the pool has 48.
    h = Harness.make(slots=48, chunked_prefill_size=64, max_prefill_tokens=64)
    reqs = [h.submit([i] * 8, max_new_tokens=20) for i in range(3)]
    retracted_first = None
    while h.scheduler.has_work():
        before = h.scheduler.counters.retractions
        h.step()
        if h.scheduler.counters.retractions > before and retracted_first is None:
            retracted_first = next(r for r in reqs if r.retractions)
            assert retracted_first.state is ReqState.WAITING and h.scheduler.waiting[0] is retracted_first
            assert retracted_first.output_ids  # it keeps its tokens and is recomputed later
    assert retracted_first is reqs[-1]  # the most recently admitted goes first
    assert all(r.output_ids == [TOKEN] * 20 for r in reqs)
    assert h.kv.allocator.available() + h.kv.cache.total_size() == 48


def test_a_lone_request_that_outgrows_the_pool_fails_and_the_rest_go_on() -> None:
    h = Harness.make(slots=16, chunked_prefill_size=64, max_prefill_tokens=64)
    big = h.submit(list(range(8)), max_new_tokens=20)  # admitted (8 + a 30% decode reserve fit); needs 28
    small = h.submit([1, 2], max_new_tokens=2)
    failed = []
    for _ in range(200):
        if not h.scheduler.has_work():
            break
        h.step()
        failed += h.scheduler.failed
    assert failed == [big] and big.finish_reason == "abort" and "too small" in (big.error or "")
    assert small.output_ids == [TOKEN] * 2
    assert h.kv.allocator.available() + h.kv.cache.total_size() == 16


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    h = Harness.make(slots=512, schedule_policy="lpm", max_running_requests=1)
    h.submit(SYSTEM + [1], max_new_tokens=1)
    h.run()  # SYSTEM is cached now
    cold = h.submit(list(range(200, 240)), max_new_tokens=1, rid="cold")
    warm = h.submit(SYSTEM + [2], max_new_tokens=1, rid="warm")
    plan = h.step()  # one running request at a time: the policy decides who is first
    assert plan.reqs == [warm]
    assert warm.cached_tokens == len(SYSTEM) and cold.state is ReqState.WAITING
    h.run()


def test_dfs_weight_runs_requests_of_one_subtree_back_to_back() -> None:
    h = Harness.make(slots=512, schedule_policy="dfs-weight")
    h.submit(SYSTEM + [1], max_new_tokens=1)
    h.submit(list(range(200, 240)) + [1], max_new_tokens=1)
    h.run()  # two cached prefixes: SYSTEM and OTHER
    other = list(range(200, 240))
    a1 = h.submit(SYSTEM + [2], max_new_tokens=1)
    b1 = h.submit(other + [2], max_new_tokens=1)
    a2 = h.submit(SYSTEM + [3], max_new_tokens=1)
    b2 = h.submit(other + [3], max_new_tokens=1)
    a3 = h.submit(SYSTEM + [4], max_new_tokens=1)
    order = [c.req for c in h.scheduler.policy.order(list(h.scheduler.waiting))]
    assert order == [a1, a2, a3, b1, b2]  # the heavier subtree first, each subtree in arrival order
    h.run()


def test_fcfs_keeps_arrival_order() -> None:
    h = Harness.make(slots=512, schedule_policy="fcfs", max_running_requests=1)
    h.submit(SYSTEM + [1], max_new_tokens=1)
    h.run()
    cold = h.submit(list(range(200, 240)), max_new_tokens=1)
    h.submit(SYSTEM + [2], max_new_tokens=1)
    assert h.step().reqs == [cold]
    h.run()


def test_in_batch_dedupe_lets_one_request_compute_a_shared_uncached_prefix() -> None:
    h = Harness.make(slots=512, schedule_policy="lpm")
    doc = list(range(300, 380))  # 80 uncached tokens shared by both
    a = h.submit(doc + [1], max_new_tokens=2)
    b = h.submit(doc + [2], max_new_tokens=2)
    plan = h.step()
    assert plan.reqs == [a] and b.state is ReqState.WAITING  # b waits a round ...
    h.run()
    assert b.cached_tokens == len(doc)  # ... and then hits what a computed


def test_kv_written_is_tracked_by_the_manager_alone() -> None:
    h = Harness.make(slots=64)
    req = h.submit([1, 2, 3, 4], max_new_tokens=3)
    h.step()
    assert req.kv_len == 4 and req.allocated >= 4 and req.row is not None
    h.run()
    assert req.row is None and req.kv_len == req.allocated == req.locked_len == 0


def test_a_step_plan_is_in_kernel_order_and_packs_into_the_declared_layout() -> None:
    from runtime.step.contract import PACKED_LAYOUT, section_sizes
    from runtime.step.forward_batch import HostBatch

    h = Harness.make(slots=256, chunked_prefill_size=64, max_prefill_tokens=64)
    decoding = h.submit([1, 2, 3], max_new_tokens=8)
    h.step()
    newcomer = h.submit(list(range(10, 20)), max_new_tokens=8)
    plan = h.scheduler.schedule()  # the decode was planned first, the prefill after it ...
    assert plan.reqs == [newcomer, decoding]  # ... but a plan lists extends first (kernel order)
    assert [len(e.token_ids) for e in plan.entries] == [10, 1]
    packed = HostBatch.pack(plan.entries, h.kv.table)
    sizes = section_sizes(tokens=11, reqs=2, logit_rows=2, futures=0)
    assert packed.sizes() == sizes and packed.host.numel() == sum(sizes) and len(sizes) == len(PACKED_LAYOUT)
    ids, positions, rows, _, logit_rows, _ = packed.split(packed.host)
    assert ids.tolist() == list(range(10, 20)) + [TOKEN]
    assert positions.tolist() == list(range(10)) + [3]
    assert rows.tolist() == [newcomer.row, decoding.row] and logit_rows.tolist() == [9, 10]
