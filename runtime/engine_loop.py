"""The engine loop: on its own thread, turns scheduler plans into forward steps and results.

Callers talk to it only through `post` (a thread-safe inbox of commands); results leave through
each request's `sink`. A fault inside one step fails the requests of that step and the loop
goes on; a fault in the loop itself is recorded in `dead` so health checks fail instead of hang.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable

import torch

from radix import BasePrefixCache, SlotAllocator
from runtime.forward_batch import ForwardBatch
from runtime.model_runner import ModelRunner
from runtime.output import Logprobs, Output
from runtime.request import Req, ReqState
from runtime.sampler import Sampler, prompt_logprobs
from runtime.scheduler import Scheduler, StepPlan
from runtime.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
Command = Callable[[], None]


class EngineLoop:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, scheduler: Scheduler, allocator: SlotAllocator,
                 cache: BasePrefixCache, context_len: int) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.allocator = allocator
        self.cache = cache
        self.context_len = context_len
        self.sampler = Sampler()
        self.inbox: queue.Queue[Command | None] = queue.Queue()
        self.requests: dict[str, Req] = {}
        self.generated_tokens = 0
        self.steps = 0
        self.dead: BaseException | None = None
        self._stats_lock = threading.Lock()
        self._stats: dict[str, float] = {}
        # Outputs are delivered after the step's stats are published, so a caller woken by its
        # final Output already sees the stats that include it.
        self._outbox: list[tuple[Callable[[Output], None], Output]] = []
        self._refresh_stats()
        self._thread = threading.Thread(target=self._run, name="radixserve-engine", daemon=True)
        self._thread.start()

    # -- the thread ---------------------------------------------------------------------------------

    def post(self, command: Command) -> None:
        if self.dead is not None:
            raise RuntimeError(f"the engine loop has stopped: {self.dead!r}")
        self.inbox.put(command)

    def stop(self) -> None:
        self.inbox.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            while True:
                block = not self.scheduler.has_work()
                while True:
                    try:
                        command = self.inbox.get(block=block, timeout=None if block else 0)
                    except queue.Empty:
                        break
                    if command is None:
                        self._abort_all("the engine shut down")
                        self._deliver()
                        return
                    command()
                    block = False
                    self._refresh_stats()
                    self._deliver()
                if self.scheduler.has_work():
                    self._step()
                self._refresh_stats()
                self._deliver()
        except BaseException as exc:  # noqa: BLE001 - recorded, then every waiter is told
            self.dead = exc
            logger.error("engine loop died:\n%s", traceback.format_exc())
            self._abort_all(f"the engine loop died: {exc!r}")
            self._deliver()

    def _deliver(self) -> None:
        outbox, self._outbox = self._outbox, []
        for sink, output in outbox:
            try:
                sink(output)
            except Exception:  # noqa: BLE001 - a caller's broken sink must not stop the loop
                logger.exception("an output sink raised")

    # -- one step -----------------------------------------------------------------------------------

    def _step(self) -> None:
        plan = self.scheduler.schedule()
        for req in self.scheduler.failed:
            self._emit_final(req)
        if not plan:
            self._unblock()
            return
        try:
            self._run_plan(plan)
        except Exception:  # noqa: BLE001 - one bad request must not take the others down
            logger.error("step failed; retrying its requests one by one:\n%s", traceback.format_exc())
            self._isolate(plan)
        self.steps += 1

    def _run_plan(self, plan: StepPlan) -> None:
        batch = ForwardBatch.build(plan.entries, self.runner.table)
        logits = self.runner.forward(batch)
        self._process(plan, batch, logits)

    def _isolate(self, plan: StepPlan) -> None:
        """Run each request of a failed step alone; fail only the ones that fail again.

        Safe to repeat: a failed forward wrote K/V only into the requests' own slots (rewritten
        identically now) and advanced nothing.
        """
        for req, entry in zip(plan.reqs, plan.entries):
            if req.state is not ReqState.RUNNING:
                continue
            try:
                self._run_plan(StepPlan([req], [entry]))
            except Exception as exc:  # noqa: BLE001 - this request is the faulty one
                logger.error("request %s failed: %r", req.rid, exc)
                self._finish(req, "abort", error=f"internal error: {exc!r}")

    def _unblock(self) -> None:
        """Nothing could be scheduled. With nothing running, the head of the queue can never fit."""
        if not self.scheduler.running and self.scheduler.waiting:
            req = self.scheduler.waiting[0]
            self._finish(req, "abort", error="the KV cache is too small for this request")
        else:
            time.sleep(0.001)

    def _process(self, plan: StepPlan, batch: ForwardBatch, logits: torch.Tensor) -> None:
        """Score prompt positions and sample first (nothing changes if that raises), then apply."""
        scored: list[tuple[Req, tuple[list, list]] | None] = []
        to_sample: list[tuple[Req, int]] = []
        for pos, original in enumerate(batch.order):
            req, entry = plan.reqs[original], plan.entries[original]
            start, count = batch.logit_starts[pos], batch.logit_counts[pos]
            first_pos = entry.prefix_len + len(entry.token_ids) - count
            if entry.logits_from is not None:
                scored.append((req, self._prompt_logprobs(req, first_pos, logits[start : start + count])))
            if entry.prefix_len + len(entry.token_ids) == req.seq_len:
                to_sample.append((req, start + count - 1))
        generating = [(req, row) for req, row in to_sample if req.params.max_new_tokens > 0]
        result = None
        if generating:
            rows = [row for _, row in generating]
            # A plain decode step samples every row in order: no need to copy the logits.
            picked = logits if rows == list(range(logits.shape[0])) else logits[torch.tensor(rows)]
            result = self.sampler.sample(picked, [r.params for r, _ in generating],
                                         [(r.prompt_ids, r.output_ids) for r, _ in generating],
                                         [r.generator for r, _ in generating])
        # -- apply --
        for item in scored:
            if item is not None:
                self._apply_prompt_logprobs(item[0], *item[1])
        for req, entry in zip(plan.reqs, plan.entries):
            req.kv_len += len(entry.token_ids)
            if req.kv_len >= len(req.prompt_ids) and req.logprobs is not None:
                req.prompt_logprobs_done = True
        finished_prefill = [r for r, _ in to_sample if not r.output_ids]
        if result is not None:
            for j, (req, _) in enumerate(generating):
                self._append(req, result.token_ids[j], result.logprobs[j], result.top_logprobs[j])
        for req, _ in to_sample:
            if req.params.max_new_tokens == 0:
                self._finish(req, "length")  # prefill only (e.g. warming a shared prefix)
            elif req.state is ReqState.RUNNING and req in finished_prefill:
                self.scheduler.kv.cache_unfinished(req)

    def _prompt_logprobs(self, req: Req, first_pos: int, rows: torch.Tensor) -> tuple[list, list]:
        """rows[j] are the logits at position first_pos + j; they score prompt token first_pos + j + 1."""
        prompt = req.prompt_ids
        start = req.params.logprob_start_len
        positions = [first_pos + j for j in range(len(rows))]
        keep = [j for j, q in enumerate(positions) if start <= q + 1 < len(prompt)]
        if not keep:
            return [], []
        targets = [prompt[positions[j] + 1] for j in keep]
        chosen, tops = prompt_logprobs(rows[keep], targets, req.params.top_logprobs_num)
        return list(zip(chosen, targets)), (tops if tops else [None] * len(keep))

    def _apply_prompt_logprobs(self, req: Req, values: list, tops: list) -> None:
        if req.logprobs is None:
            req.logprobs = Logprobs()
        lp = req.logprobs
        if req.params.logprob_start_len == 0 and not lp.input_token_logprobs:
            lp.input_token_logprobs.append((None, req.prompt_ids[0]))
            lp.input_top_logprobs.append(None)
        lp.input_token_logprobs.extend(values)
        lp.input_top_logprobs.extend(tops)

    def _append(self, req: Req, token: int, logprob: float | None, top: list | None) -> None:
        req.output_ids.append(token)
        self.generated_tokens += 1
        if req.params.return_logprob:
            assert logprob is not None
            if req.logprobs is None:
                req.logprobs = Logprobs()
            req.logprobs.output_token_logprobs.append((logprob, token))
            if top is not None:
                req.logprobs.output_top_logprobs.append(top)
        params = req.params
        if (not params.ignore_eos and token in self.tokenizer.eos_token_ids) or token in params.stop_token_ids:
            req.matched_stop = token
            self._finish(req, "stop")
            return
        if req.detok.add(token):
            req.matched_stop = req.detok.matched_stop
            self._finish(req, "stop")
            return
        if len(req.output_ids) >= params.max_new_tokens or req.seq_len >= self.context_len:
            self._finish(req, "length")
            return
        if req.stream:
            delta = req.detok.take_delta(final=False)
            self._outbox.append((req.sink, req.snapshot(delta)))

    # -- finishing ----------------------------------------------------------------------------------

    def _finish(self, req: Req, reason: str, error: str | None = None) -> None:
        if req.state is ReqState.FINISHED:
            return
        req.finish_reason = reason
        req.error = error
        self.scheduler.remove(req)
        self._emit_final(req)

    def _emit_final(self, req: Req) -> None:
        if req.matched_stop is None or isinstance(req.matched_stop, int):
            req.detok.flush()
        delta = req.detok.take_delta(final=True)
        self.requests.pop(req.rid, None)
        self._outbox.append((req.sink, req.snapshot(delta)))

    def _abort_all(self, message: str) -> None:
        for req in list(self.requests.values()):
            if req.state is not ReqState.FINISHED:
                req.error = message
                req.finish_reason = "abort"
                req.state = ReqState.FINISHED
                self._emit_final(req)

    # -- commands (run on the loop thread) ----------------------------------------------------------

    def add_request(self, req: Req) -> None:
        self.requests[req.rid] = req
        self.scheduler.add(req)

    def abort(self, rid: str) -> None:
        """Abort `rid`, or every sample `rid.i` of an n > 1 request."""
        for key in [k for k in self.requests if k == rid or k.startswith(rid + ".")]:
            self._finish(self.requests[key], "abort")

    def flush_cache(self) -> bool:
        """Drop every cached prefix nobody is using; a full reset when nothing runs."""
        if self.scheduler.has_work():
            self.cache.evict(self.allocator.num_slots)
            return False
        self.cache.reset()
        return True

    # -- stats --------------------------------------------------------------------------------------

    def _refresh_stats(self) -> None:
        sched = self.scheduler
        counters = sched.counters
        in_use = sum(r.allocated - r.locked_len for r in sched.running)
        stats = {
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting),
            "prompt_tokens_total": counters.prompt_tokens,
            "cached_tokens_total": counters.cached_tokens,
            "computed_prompt_tokens_total": counters.computed_prompt_tokens,
            "generated_tokens_total": self.generated_tokens,
            "cache_hit_rate": counters.cached_tokens / counters.prompt_tokens if counters.prompt_tokens else 0.0,
            "slots_free": self.allocator.available(),
            "slots_cached": self.cache.total_size(),
            "slots_in_use": in_use,
            "slots_total": self.allocator.num_slots,
            "retractions_total": counters.retractions,
            "steps_total": self.steps,
        }
        with self._stats_lock:
            self._stats = stats

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            return dict(self._stats)
