"""The scheduler: which requests run in the next forward step, and with how many new tokens.

Each step is one ragged batch: every running request that is decoding contributes one token,
and prompt tokens fill the rest up to `max_prefill_tokens` (chunks of at most
`chunked_prefill_size` per request, so a long prompt never stalls the decoders). Decodes get
their KV slots first; when none are left even after evicting cache leaves, the most recently
admitted requests are retracted (their KV handed to the cache, their tokens kept) and recomputed
later. New requests are admitted in policy order while there is room for their prompt plus a
reserve for the decoding already under way.

What planning does for one request (its prefix match, its KV, its draft from prompt lookup or its
grammar's forced continuation, its entry in the plan) runs inside `_planning`, the per-request
seam: an exception there fails that request alone, gives back what it held, and the step is
planned for the others.
"""

from __future__ import annotations

import logging
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from radix import MatchResult
from runtime.engine_args import EngineArgs
from runtime.kv import KVManager
from runtime.output import Logprobs
from runtime.sampling.pooling import PoolState
from runtime.sampling.jump_forward import JumpForward
from runtime.sampling.speculative import SpeculativeConfig, may_speculate, propose_draft
from runtime.step.contract import StepPlan
from runtime.step.request import Req, ReqState
from runtime.step.schedule_policy import SchedulePolicy

# Room held back for running requests' future tokens: this share of (at most DECODE_RESERVE_CAP)
# tokens each still may generate. Retraction covers the cases where the estimate is short.
DECODE_RESERVE_RATIO = 0.3
DECODE_RESERVE_CAP = 256

logger = logging.getLogger(__name__)


@dataclass
class SchedulerCounters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    computed_prompt_tokens: int = 0  # prompt tokens actually run through the model (incl. recompute)
    retractions: int = 0
    draft_tokens: int = 0  # tokens proposed by prompt lookup (runtime/sampling/speculative.py)
    forced_draft_tokens: int = 0  # tokens proposed by jump-forward (runtime/sampling/jump_forward.py)


class Scheduler:
    def __init__(self, args: EngineArgs, kv: KVManager, policy: SchedulePolicy,
                 jump_forward: JumpForward | None = None) -> None:
        """jump_forward: drafts constrained requests' forced continuations (None: off)."""
        self.args = args
        self.kv = kv
        self.policy = policy
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.counters = SchedulerCounters()
        self.failed: list[Req] = []  # requests the scheduler gave up on this step (engine reports them)
        self.on_dequeue: Callable[[Req], None] = lambda req: None  # a new request left the waiting queue
        self.speculative = (SpeculativeConfig(args.speculative_num_draft_tokens, args.speculative_ngram_min,
                                              args.speculative_ngram_max, args.speculative_disable_by_batch_size)
                            if args.speculative_algorithm == "ngram" else None)
        self.jump_forward = jump_forward

    def add(self, req: Req) -> None:
        self.waiting.append(req)
        self.kv.prefetch(req)  # what of its prefix is only on disk is read while it waits

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req: Req) -> None:
        """Take a request out (finished or aborted), handing its KV to the cache."""
        if req.state is ReqState.RUNNING:
            self.running.remove(req)
            self.kv.release(req)
        elif req.state is ReqState.WAITING and req in self.waiting:
            self.waiting.remove(req)
            if req.cached_tokens < 0:
                self.on_dequeue(req)
        req.state = ReqState.FINISHED

    # -- one step ----------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.failed = []
        self._schedule_decodes(plan)
        budget = self.args.max_prefill_tokens
        budget = self._continue_prefills(plan, budget)
        self._admit(plan, budget)
        if not plan and self.running:
            self._relieve_stall(plan)
        return plan

    def _relieve_stall(self, plan: StepPlan) -> None:
        """Every running request is mid-prefill and none can grow: nothing would ever free a slot.
        Retract the newest so the others can go on; a lone request that cannot grow never fits."""
        if len(self.running) > 1:
            self._retract(self.running[-1], plan)
        else:
            self._fail(self.running[0], "the KV cache is too small for this request")

    def _schedule_decodes(self, plan: StepPlan) -> None:
        decoding = [r for r in self.running if r.is_decoding]
        drafts, forced = self._drafts(decoding, plan)
        decoding = [r for r in decoding if r.state is ReqState.RUNNING]  # (less any whose draft failed)
        if drafts and not self.kv.grow_decodes(decoding, drafts):
            drafts = {}  # no room to verify drafts this step: decode one token each
        if drafts or self.kv.grow_decodes(decoding):  # the common case: everyone fits, one allocation
            for req in decoding:
                with self._planning(req, plan):
                    self._plan_decode(plan, req, drafts.get(req), forced.get(req, 0))
            return
        for req in decoding:
            if req.state is not ReqState.RUNNING:
                continue  # retracted for an earlier one this step
            with self._planning(req, plan):
                while not self.kv.grow(req, req.kv_len + 1):
                    victim = next((r for r in reversed(self.running) if r is not req), None)
                    if victim is None:
                        self._fail(req, "the KV cache is too small for this request")
                        break
                    self._retract(victim, plan)
                else:
                    plan.add(req, 1)

    def _plan_decode(self, plan: StepPlan, req: Req, draft: list[int] | None, forced: int) -> None:
        """A decoding request's entry: its next token, and its draft to verify where it has one."""
        if not draft:
            plan.add(req, 1)
            return
        plan.add_draft(req, draft, forced)
        self.counters.draft_tokens += len(draft) - forced
        self.counters.forced_draft_tokens += forced

    def _drafts(self, decoding: list[Req], plan: StepPlan) -> tuple[dict[Req, list[int]], dict[Req, int]]:
        """Drafts for the decoding requests that may speculate, and how many of each one's leading
        tokens are its grammar's forced continuation (runtime/sampling/speculative.py). A request
        whose drafting raises is failed (`_planning`) and has no draft."""
        config, jump = self.speculative, self.jump_forward
        if config is None and jump is None:
            return {}, {}
        if config is not None and config.disable_by_batch_size is not None and len(decoding) >= config.disable_by_batch_size:
            return {}, {}
        drafts, forced = {}, {}
        for req in decoding:
            if not may_speculate(req) or (config is None and req.grammar is None):
                continue
            # never past max_new_tokens (the verified tokens plus the model's own next one) or the context
            room = min(req.params.max_new_tokens - len(req.output_ids) - 1, self.kv.table.max_context - req.seq_len - 1)
            if room > 0:
                with self._planning(req, plan):
                    draft, forced[req] = propose_draft(req, room, config, jump)
                    if draft:
                        drafts[req] = draft
        return drafts, forced

    def _continue_prefills(self, plan: StepPlan, budget: int) -> int:
        for req in list(self.running):
            if budget <= 0:
                break
            if req.state is not ReqState.RUNNING or req.is_decoding or req in plan or req.pending <= 0:
                continue  # (pending 0: a prompt-only request whose step is still in flight)
            with self._planning(req, plan):
                chunk = min(req.pending, self.args.chunked_prefill_size, budget)
                if not self.kv.grow(req, req.kv_len + chunk):
                    continue  # try again next step, once decodes have freed or cached something
                self._plan_prefill(plan, req, chunk)
                budget -= chunk
        return budget

    def _admit(self, plan: StepPlan, budget: int) -> None:
        if not self.waiting or budget <= 0:
            return
        admitted = 0
        running_remaining = sum(self._remaining(r) for r in self.running)  # kept up to date below
        # Every running request is in every step, so at most max_loras_per_batch adapters may run at once.
        adapters = {r.lora for r in self.running if r.lora is not None}
        for cand in self.policy.order(list(self.waiting), guard=lambda r: self._planning(r, plan)):
            if budget <= 0 or len(self.running) >= self.args.max_running_requests:
                break
            if self.kv.table.available() == 0:
                break
            if cand.deprioritized and admitted:
                continue
            req = cand.req
            with self._planning(req, plan):
                if req.inflight:  # retracted while its last token was in flight: admit once it has landed
                    continue
                if (req.lora is not None and req.lora not in adapters
                        and len(adapters) >= self.args.max_loras_per_batch):
                    continue  # waits until a request of another adapter ends
                # Match again: admitting earlier candidates may have evicted what we matched before;
                # first bring back what of its prefix was demoted to the host or disk tier.
                self.kv.promote(req)
                match, ready = self._match(req)
                prefix = len(match.indices)
                chunk = min(req.seq_len - prefix, self.args.chunked_prefill_size, budget)
                need = self.kv.pages_for(prefix + chunk) - prefix
                reserve = int((running_remaining + self._remaining(req)) * DECODE_RESERVE_RATIO)
                # Locked from here: the request owns the lock once admitted (KVManager.admit), and
                # nothing of its own runs before that, so a fault never strands it (`_planning`).
                self.kv.cache.lock(match.node)
                if self.kv.room() < need + reserve:
                    self.kv.cache.unlock(match.node)
                    break
                self.waiting.remove(req)
                self.kv.admit(req, match.indices, match.node)
                if not self.kv.grow(req, prefix + chunk):  # cannot happen after the room check
                    self._retract(req, plan)
                    break
                req.state = ReqState.RUNNING
                self.running.append(req)
                if req.lora is not None:
                    adapters.add(req.lora)
                running_remaining += self._remaining(req)
                if req.cached_tokens < 0:  # first admission (not a recompute after retraction)
                    req.cached_tokens = prefix
                    self.on_dequeue(req)
                    self.counters.prompt_tokens += len(req.prompt_ids)
                    self.counters.cached_tokens += prefix
                if ready is not None:  # the whole prompt and its last logits were kept: no forward
                    plan.add_ready(req, ready)
                    self.kv.last_logits.hits += 1
                else:
                    self._plan_prefill(plan, req, chunk)
                    budget -= chunk
                admitted += 1

    def _match(self, req: Req) -> tuple[MatchResult, torch.Tensor | None]:
        """The cached prefix a request may use, and the logits at its last prompt position where
        its whole prompt is cached and they were kept (an exact re-send: runtime/kv/last_logits.py)."""
        limit = req.max_prefix_match()
        first = req.cached_tokens < 0 and not req.output_ids and req.params.max_new_tokens > 0
        ready = self.kv.last_logits.get(req.prompt_ids, req.extra_key) if first and limit == req.seq_len - 1 else None
        if ready is not None:
            match = self.kv.cache.match_prefix(req.all_ids, req.extra_key)
            if len(match.indices) == req.seq_len:
                return match, ready
        return self.kv.cache.match_prefix(req.all_ids[:limit], req.extra_key), None

    def _plan_prefill(self, plan: StepPlan, req: Req, chunk: int) -> None:
        logits_from = None
        if req.wants_prompt_logprobs():
            first = max(req.params.logprob_start_len - 1, 0)  # position whose logits score token `start`
            logits_from = max(first - req.kv_len, 0) if first < req.kv_len + chunk else None
            if req.logprobs is None:
                req.logprobs = Logprobs()
        plan.add(req, chunk, logits_from)
        self.counters.computed_prompt_tokens += chunk

    @staticmethod
    def _remaining(r: Req) -> int:
        """Tokens a request may still generate, as far as the decode reserve counts them."""
        return min(max(r.params.max_new_tokens - len(r.output_ids), 0), DECODE_RESERVE_CAP)

    def _retract(self, req: Req, plan: StepPlan) -> None:
        """Preempt: hand its KV to the cache, keep its tokens, and requeue it at the front."""
        plan.drop(req)
        if req in self.running:
            self.running.remove(req)
        self.kv.release(req)
        req.state = ReqState.WAITING
        req.retractions += 1
        if not req.prompt_logprobs_done and req.logprobs is not None:
            req.logprobs.input_token_logprobs.clear()
            req.logprobs.input_top_logprobs.clear()
        if req.pooling is not None:
            req.pool_state = PoolState()  # its prompt computes again from its cached prefix
        self.counters.retractions += 1
        self.waiting.appendleft(req)

    def _fail(self, req: Req, message: str) -> None:
        req.error = message
        req.finish_reason = "abort"
        self.remove(req)
        self.failed.append(req)

    # -- the per-request seam ----------------------------------------------------------------------

    @contextmanager
    def _planning(self, req: Req, plan: StepPlan) -> Iterator[None]:
        """Run one request's part of planning a step; if it raises, fail that request alone.

        Planning runs code that depends on the request (its prefix match, its grammar's forced
        continuation, its prompt-lookup draft, its adapter, its KV growth). A bug there, met for
        one request, must not reach the engine loop, which would die and abort every request.
        Instead the request ends with "abort" and "internal error: ...", gives back everything it
        holds (`_drop_faulty`), and the step goes on for the others. The exception is swallowed:
        the caller's loop continues with the next request.
        """
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - one request's fault must not end the others
            logger.error("planning request %s failed; failing it alone:\n%s", req.rid, traceback.format_exc())
            self._drop_faulty(req, plan, f"internal error: {exc!r}")

    def _drop_faulty(self, req: Req, plan: StepPlan, message: str) -> None:
        """Fail a request whose planning raised, at whatever point it raised: out of the plan and
        the queues, and its table row, KV slots and prefix-cache lock given back. Nothing of it is
        cached (KVManager.discard): what went wrong may be its tokens, and this path must not run
        the tree code that may have raised. The loop emits it as it does `_fail`'s."""
        if req.state is ReqState.FINISHED:
            return  # failed already (`_fail` gave it back), and then something raised
        plan.drop(req)
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.kv.discard(req)
        if req.cached_tokens < 0:  # it left the queue uncounted (the engine's queued count)
            req.cached_tokens = 0
            self.on_dequeue(req)
        req.state = ReqState.FINISHED
        req.error, req.finish_reason = message, "abort"
        self.failed.append(req)
