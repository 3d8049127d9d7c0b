"""A scheduler harness without a model: the KV state of runtime/kv/, the real Scheduler, and a
fake forward that "computes" a step's KV and samples a fixed token for each request that reached
its last known token. Tests of scheduling and slot accounting run on it in milliseconds."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from runtime.engine_args import EngineArgs
from runtime.kv import KVManager, KVShape, build_kv
from runtime.sampling_params import SamplingParams
from runtime.step.contract import StepPlan
from runtime.step.request import Req, ReqState
from runtime.step.schedule_policy import SchedulePolicy
from runtime.step.scheduler import Scheduler

TOKEN = 7  # what the fake model always samples


@dataclass
class Harness:
    scheduler: Scheduler
    kv: KVManager
    finished: list[Req] = field(default_factory=list)
    arrivals: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def make(cls, slots: int, page_size: int = 1, prefix_cache: bool = True, **args: object) -> Harness:
        shape = KVShape(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
        engine_args = EngineArgs(page_size=page_size, kv_cache_tokens=slots, enable_prefix_cache=prefix_cache,
                                 **args)  # type: ignore[arg-type]
        kv = build_kv(shape, slots, page_size, engine_args.max_running_requests, max_context=slots,
                      prefix_cache=prefix_cache)
        policy = SchedulePolicy(engine_args.schedule_policy, kv.cache, engine_args.lpm_fallback_queue_len, page_size)
        return cls(Scheduler(engine_args, kv, policy), kv)

    def submit(self, prompt: list[int], max_new_tokens: int = 4, rid: str | None = None) -> Req:
        arrival = next(self.arrivals)
        req = Req(rid=rid or f"r{arrival}", prompt_ids=list(prompt), params=SamplingParams(max_new_tokens=max_new_tokens),
                  detok=None, sink=lambda out: None, seed=0, arrival=arrival)  # type: ignore[arg-type]
        self.scheduler.add(req)
        return req

    def step(self) -> StepPlan:
        """Plan one step and run it: KV computed, one token for each request at its last token."""
        plan = self.scheduler.schedule()
        for req, entry in zip(plan.reqs, plan.entries):
            self.kv.computed(req, len(entry.token_ids))
            if entry.prefix_len + len(entry.token_ids) == req.planned_len:
                req.output_ids.append(TOKEN)
                if len(req.output_ids) >= req.params.max_new_tokens:
                    self.scheduler.remove(req)
                    req.finish_reason = "length"
                    self.finished.append(req)
                elif req.state is ReqState.RUNNING and len(req.output_ids) == 1:
                    self.kv.cache_unfinished(req)
        self.check_slots()
        return plan

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            self.step()
        raise AssertionError("the scheduler did not finish its work")

    def check_slots(self) -> None:
        """Every slot in exactly one place: free, held by the cache, or held by a running request."""
        kv = self.kv
        free = kv.allocator.free_slot_set()
        cached = set(kv.cache.cached_slots().tolist()) if hasattr(kv.cache, "cached_slots") else set()
        held: list[int] = []
        for req in self.scheduler.running:
            held += kv.table.read(req.row, req.allocated)[req.locked_len :].tolist()
        assert len(held) == len(set(held)), "a slot held twice"
        assert not (free & cached) and not (free & set(held)) and not (cached & set(held))
        assert len(free) + len(cached) + len(held) == kv.allocator.num_slots
