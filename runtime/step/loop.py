"""The engine loop: on its own thread, turns scheduler plans into forward steps and results.

One step reads plan -> forward -> sample -> process: the scheduler plans (runtime/step/scheduler.py),
the runner lays the plan out on the device and runs the model to the logit rows (eagerly, or by
replaying a CUDA graph for a decode step: runtime/exec/model_runner.py), the step sampler fills the
grammar bitmasks, has the step's logits computed (runtime/exec/step_logits.py: a constrained row
whose grammar allows few tokens only at those), scores prompt logprobs and chooses tokens
(runtime/sampling/step_sampler.py), and the output processor applies them
(runtime/step/output_processor.py). What passes between them is declared in runtime/step/contract.py. The
loop itself keeps the thread, the inbox of commands, overlap and fault isolation.

With overlap on (the default on a GPU), "process" for step n runs after step n+1 is launched:
the scheduler plans step n+1 while step n's ids are still on the device, a decode entry names
its token as a `future` (an index into step n's sampled ids), and the host reads step n's ids
while the device runs step n+1. Without overlap (the CPU default) each step is processed at once.

Callers talk to the loop only through `post` (a thread-safe inbox of commands); results leave
through each request's `sink`. A fault while planning one request fails that request (the
scheduler's per-request seam, Scheduler._planning); a fault inside one step fails the requests of
that step (retried one by one first); either way the loop goes on. A fault in the loop itself,
planning included where no one request is to blame, is recorded in `dead` so health checks fail
instead of hang.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from runtime.exec.model_runner import ModelRunner
from runtime.kv import KVManager
from runtime.sampling.sampler import Sampler, has_penalty
from runtime.sampling.allowed_ids import NARROW_MAX_TOKENS
from runtime.sampling.step_sampler import GrammarFill, StepSampler
from runtime.step.contract import BatchEntry, StepOutputs, StepPlan
from runtime.step.output_processor import OutputProcessor
from runtime.step.request import Req, ReqState
from runtime.step.scheduler import Scheduler
from runtime.step.timing import StepTimings
from runtime.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
Command = Callable[[], None]


@dataclass
class LaunchedStep:
    """A step on the device: its plan, and what it produced (tokens possibly not yet on the host)."""

    plan: StepPlan
    outputs: StepOutputs

    @property
    def sampled_ids(self) -> torch.Tensor | None:
        """The step's chosen ids on the device: the next step reads its decode tokens from here."""
        return self.outputs.result.ids if self.outputs.result is not None else None


class EngineLoop:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, scheduler: Scheduler, kv: KVManager,
                 context_len: int, overlap: bool = False, grammar_fill: GrammarFill | None = None,
                 narrow_max: int = NARROW_MAX_TOKENS) -> None:
        """grammar_fill: the bitmask of logits rows' grammar matchers (the Engine's
        runtime.sampling.grammar.Grammars, built on the first constrained request); narrow_max: a
        constrained row whose grammar allows at most this many tokens is computed only at those
        (runtime/sampling/allowed_ids.py; 0: never)."""
        self.runner = runner
        # Overlap: step n+1 is planned and launched before step n's tokens are read on the host;
        # `_inflight` is the launched step whose tokens the host has not read yet.
        self.overlap = overlap
        self._inflight: LaunchedStep | None = None
        self.timings: StepTimings | None = None  # Engine.time_steps() sets it (runtime/step/timing.py)
        self.scheduler = scheduler
        self.kv = kv  # the KV state's one owner (runtime/kv/)
        self._grammar_fill = grammar_fill or (lambda matchers: None)
        self.sampling = StepSampler(Sampler(set(tokenizer.eos_token_ids)), self._timed_fill,
                                    kv.last_logits if kv.cache.shares else None, narrow_max)
        self.output = OutputProcessor(scheduler, kv, set(tokenizer.eos_token_ids), context_len)
        self.requests = self.output.requests
        self.inbox: queue.Queue[Command | None] = queue.Queue()
        self.steps = 0
        self.dead: BaseException | None = None
        self._stats_lock = threading.Lock()
        self._stats: dict[str, float] = {}
        self._refresh_stats()
        self.ready = threading.Event()  # set once warmed up (or dead): Engine() returns then
        self._thread = threading.Thread(target=self._run, name="radixserve-engine", daemon=True)
        self._thread.start()

    # -- the thread ---------------------------------------------------------------------------------

    def post(self, command: Command) -> None:
        if self.dead is not None:
            raise RuntimeError(f"the engine loop has stopped: {self.dead!r}")
        self.inbox.put(command)

    @property
    def alive(self) -> bool:
        return self.dead is None and self._thread.is_alive()

    def stop(self) -> None:
        self.inbox.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            warm_up = getattr(self.runner, "warm_up", None)  # (a test's stand-in runner may have none)
            if warm_up is not None:
                warm_up(self.scheduler.args.max_running_requests)
            self.ready.set()
            while True:
                block = not self.scheduler.has_work()
                while True:
                    try:
                        command = self.inbox.get(block=block, timeout=None if block else 0)
                    except queue.Empty:
                        break
                    if command is None:
                        self.output.abort_all("the engine shut down")
                        self._deliver()
                        return
                    command()
                    block = False
                    self._refresh_stats()
                    self._deliver()
                self.kv.pins.expire()
                if self.scheduler.has_work() or self._inflight is not None:
                    self._step()
                self._refresh_stats()
                self._deliver()
        except BaseException as exc:  # noqa: BLE001 - recorded, then every waiter is told
            self.dead = exc
            self.ready.set()
            logger.error("engine loop died:\n%s", traceback.format_exc())
            self.output.abort_all(f"the engine loop died: {exc!r}")
            self._deliver()

    def _deliver(self) -> None:
        outbox, self.output.outbox = self.output.outbox, []
        for sink, output in outbox:
            try:
                sink(output)
            except Exception:  # noqa: BLE001 - a caller's broken sink must not stop the loop
                logger.exception("an output sink raised")

    # -- one step -----------------------------------------------------------------------------------

    def _step(self) -> None:
        if self._inflight is not None and self._drafts_wait(self._inflight):
            self._complete_inflight()  # its constrained requests draft only from a last token on the host
        plan = self._schedule()
        if not plan:
            if self._inflight is not None:
                self._complete_inflight()  # its results may free room or finish requests
            else:
                self._unblock()
            return
        try:
            launched = self._launch(plan)
        except Exception:  # noqa: BLE001 - one bad request must not take the others down
            logger.error("step failed; retrying its requests one by one:\n%s", traceback.format_exc())
            self._complete_inflight()
            self._isolate(plan)
        else:
            # Overlap: the previous step's results are read while this one runs on the device.
            self._complete_inflight()
            if self.overlap:
                self._inflight = launched
            else:
                self._complete(launched)
        self.steps += 1

    def _schedule(self) -> StepPlan:
        """Plan the next step, and emit the requests planning failed: those it could not fit, and
        those it failed alone because their own planning raised (Scheduler._planning). They are
        emitted even when planning itself raises, for no one request (a bug of its own): the loop
        then dies of it (`_run`), and they still hear their own reason rather than the loop's."""
        try:
            with self._timed("schedule"):
                return self.scheduler.schedule()
        finally:
            failed, self.scheduler.failed = self.scheduler.failed, []
            for req in failed:
                self.output.emit_final(req)

    def _drafts_wait(self, launched: LaunchedStep) -> bool:
        """Whether the next step should be planned after `launched` is read rather than beside it:
        a draft's kept length is known only then, and a constrained request drafts its grammar's
        forced continuation (runtime/sampling/jump_forward.py) only once its matcher has taken its
        last token. The masks are filled on the host anyway, so little overlap is lost: the next
        forward still runs while they are."""
        return bool(launched.outputs.drafts) or self.scheduler.jump_forward is not None and any(
            r.grammar is not None and r.params.speculative for r in launched.outputs.generating)

    def _launch(self, plan: StepPlan) -> LaunchedStep:
        """Forward and sample one step; its tokens stay on the device (and start their way home)."""
        previous = self._inflight
        with self._timed("launch"), self.timings.device_work() if self.timings else nullcontext():
            # (a step of ready requests only, whose prompts were all cached with their logits, has no forward)
            logits, layout, hidden = (self.runner.run(plan.entries, previous.sampled_ids if previous else None)
                                      if plan.entries else (None, None, None))
            if previous is not None and any(_needs_host_state(r) for r in plan.reqs):
                self._complete_inflight()  # a grammar or penalty must see the previous token first
            outputs = self.sampling.sample(plan, layout, logits, hidden)
        self.output.advance(plan, outputs)
        return LaunchedStep(plan, outputs)

    def _complete(self, launched: LaunchedStep) -> None:
        try:
            with self._timed("process"):
                self.output.process(launched.outputs)
        except Exception as exc:  # noqa: BLE001 - fail this step's requests, keep serving the rest
            logger.error("processing a step's outputs failed:\n%s", traceback.format_exc())
            for req in launched.plan.reqs:
                self.output.finish(req, "abort", error=f"internal error: {exc!r}")

    def _timed(self, phase: str) -> AbstractContextManager[None]:
        return self.timings.host(phase) if self.timings is not None else nullcontext()

    def _timed_fill(self, matchers: list) -> torch.Tensor:
        with self._timed("mask"):
            return self._grammar_fill(matchers)

    def _complete_inflight(self) -> None:
        launched, self._inflight = self._inflight, None
        if launched is not None:
            self._complete(launched)

    def _isolate(self, plan: StepPlan) -> None:
        """Run each request of a failed step alone; fail only the ones that fail again.

        Safe to repeat: a failed forward wrote K/V only into the requests' own slots (rewritten
        identically now) and advanced nothing. Tokens that were in flight have landed by now.
        """
        alone: list[tuple[Req, StepPlan]] = []
        for req, entry in zip(plan.reqs, plan.entries):
            if entry.future is not None:
                entry = BatchEntry(entry.row, entry.prefix_len, [req.token_at(entry.prefix_len)], entry.logits_from,
                                   lora=entry.lora)
            alone.append((req, StepPlan.of(req, entry)))
        alone += [(req, StepPlan(ready=[(req, row)])) for req, row in plan.ready]
        for req, step in alone:
            if req.state is not ReqState.RUNNING:
                continue  # (finished by an earlier one's tokens)
            try:
                self._complete(self._launch(step))
            except Exception as exc:  # noqa: BLE001 - this request is the faulty one
                logger.error("request %s failed: %r", req.rid, exc)
                self.output.finish(req, "abort", error=f"internal error: {exc!r}")

    def _unblock(self) -> None:
        """Nothing could be scheduled. With nothing running, the head of the queue can never fit."""
        if not self.scheduler.running and self.scheduler.waiting:
            if self.kv.pins.release_oldest():
                return  # pinned conversations make room before anyone is failed
            req = self.scheduler.waiting[0]
            self.output.finish(req, "abort", error="the KV cache is too small for this request")
        else:
            time.sleep(0.001)

    # -- commands (run on the loop thread) ----------------------------------------------------------

    def set_timings(self, timings: StepTimings | None) -> None:
        self.timings = timings

    def add_request(self, req: Req) -> None:
        self.requests[req.rid] = req
        self.scheduler.add(req)

    def abort(self, rid: str) -> None:
        """Abort `rid`, or every sample `rid.i` of an n > 1 request."""
        for key in [k for k in self.requests if k == rid or k.startswith(rid + ".")]:
            self.output.finish(self.requests[key], "abort")

    def flush_cache(self) -> bool:
        """Drop every cached prefix nobody is using (pins included); a full reset when nothing runs."""
        self.kv.pins.release_all()
        self.kv.last_logits.clear()
        if self.scheduler.has_work():
            self.kv.cache.evict(self.kv.allocator.num_slots)
            return False
        self.kv.cache.reset()
        return True

    # -- stats --------------------------------------------------------------------------------------

    def _refresh_stats(self) -> None:
        sched = self.scheduler
        counters = sched.counters
        in_use = sum(r.allocated - r.locked_len for r in sched.running)
        allocator, cache = self.kv.allocator, self.kv.cache
        stats = {
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting),
            "prompt_tokens_total": counters.prompt_tokens,
            "cached_tokens_total": counters.cached_tokens,
            "computed_prompt_tokens_total": counters.computed_prompt_tokens,
            "generated_tokens_total": self.output.generated_tokens,
            "cache_hit_rate": counters.cached_tokens / counters.prompt_tokens if counters.prompt_tokens else 0.0,
            "slots_free": allocator.available(),
            "slots_cached": cache.total_size(),
            "slots_in_use": in_use,
            "slots_total": allocator.num_slots,
            "retractions_total": counters.retractions,
            "prompts_without_forward_total": self.kv.last_logits.hits,  # exact re-sends (kv/last_logits.py)
            "steps_total": self.steps,
            "narrowed_logit_rows_total": self.sampling.narrowed_rows,  # at allowed ids only (exec/step_logits.py)
        }
        threads = getattr(self.runner, "threads", None)
        if threads is not None:  # the CPU's thread count, following what other processes leave us (runtime/cpu/)
            stats.update({"cpu_threads": threads.threads, "cpu_threads_changes_total": threads.changes,
                          "cpu_cores_used_by_others": round(threads.others, 2)})
        if sched.speculative is not None:  # prompt-lookup speculative decoding (runtime/sampling/speculative.py)
            drafted, kept = counters.draft_tokens, self.output.accepted_draft_tokens
            stats.update({"spec_draft_tokens_total": drafted, "spec_accepted_tokens_total": kept,
                          "spec_acceptance_rate": kept / drafted if drafted else 0.0})
        if sched.jump_forward is not None:  # constrained requests' forced continuations (runtime/sampling/jump_forward.py)
            stats.update({"jump_forward_draft_tokens_total": counters.forced_draft_tokens,
                          "jump_forward_accepted_tokens_total": self.output.accepted_forced_tokens})
        if self.kv.tiers is not None:  # the prefix cache's host and disk tiers (runtime/kv/tiers.py)
            tiers, tree = self.kv.tiers, cache.stats  # type: ignore[attr-defined]
            stats.update({
                "tier_lower_tokens": cache.lower_size(),
                "tier_host_tokens": tiers.host_tokens(),
                "tier_disk_bytes": tiers.disk_bytes(),
                "tier_promoted_host_tokens_total": tree.promoted_tokens.get("host", 0),
                "tier_promoted_disk_tokens_total": tree.promoted_tokens.get("disk", 0),
                "tier_demoted_tokens_total": tree.demoted_tokens,
                "tier_dropped_tokens_total": tree.dropped_tokens,
                "tier_disk_writes_total": tiers.stats.writes,
                "tier_disk_corrupt_total": tiers.stats.corrupt,
                "tier_disk_prefetched_total": tiers.stats.prefetched,
            })
        with self._stats_lock:
            self._stats = stats

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            return dict(self._stats)


def _needs_host_state(req: Req) -> bool:
    """Whether sampling this request's next token reads its previous token on the host."""
    return bool(req.inflight) and (req.grammar is not None or has_penalty(req.params))
