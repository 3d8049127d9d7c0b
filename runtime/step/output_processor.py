"""After a step's tokens are chosen: append them, check stops, detokenize, finish, and queue outputs.

The engine loop's last room (plan -> forward -> sample -> process). It owns the outbox: outputs
are delivered by the loop after the step's stats are published, so a caller woken by its final
Output already sees the stats that include it.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.kv import KVManager
from runtime.output import Logprobs, Output
from runtime.sampling.pooling import finish_pooled
from runtime.sampling.sampler import SampleResult
from runtime.sampling.speculative import accepted
from runtime.step.contract import StepOutputs, StepPlan
from runtime.step.request import Req, ReqState
from runtime.step.scheduler import Scheduler


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, kv: KVManager, eos_token_ids: set[int], context_len: int) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        self.requests: dict[str, Req] = {}  # every request not yet finished, by rid
        self.generated_tokens = 0
        self.accepted_draft_tokens = 0  # prompt-lookup draft tokens the model chose too (runtime/sampling/speculative.py)
        self.accepted_forced_tokens = 0  # jump-forward draft tokens the model chose too (runtime/sampling/jump_forward.py)
        self.outbox: list[tuple[Callable[[Output], None], Output]] = []

    def advance(self, plan: StepPlan, out: StepOutputs) -> None:
        """Right after a step is launched: its KV counts as computed, its sampled tokens are in flight.

        The scheduler may plan the next step from here on, before the tokens reach the host.
        """
        for req, entry in zip(plan.reqs, plan.entries):
            self.kv.computed(req, len(entry.token_ids))
            if req.kv_len >= len(req.prompt_ids) and req.logprobs is not None:
                req.prompt_logprobs_done = True
        for j, req in enumerate(out.generating):
            req.inflight += 1
            req.inflight_index = j

    def process(self, out: StepOutputs) -> None:
        """Once a step's tokens are on the host: append them, check stops, stream, finish.

        A request finished or aborted since the step was launched is skipped (its token was
        computed for nothing); one retracted since still gets its token.
        """
        for req, values, tops in out.prompt_logprobs:
            self._apply_prompt_logprobs(req, values, tops)
        for req, rows in out.pooled:
            if req.state is ReqState.RUNNING:
                req.pool_state.add(rows)
                if rows.last:
                    req.pooled = finish_pooled(req.pooling, req.pool_state, rows)  # type: ignore[arg-type]
        finished_prefill = [r for r in out.sampled_reqs if not r.output_ids]
        if out.result is not None:
            r = out.result.result()
            for j, req in enumerate(out.generating):
                if req.state is ReqState.FINISHED:
                    continue
                req.inflight -= 1
                self._append(req, r.token_ids[j], r.logprobs[j], r.top_logprobs[j])
            self._verify_drafts(out, r, len(out.generating))
        for req in out.sampled_reqs:
            if req.pooled is not None:
                self.finish(req, "stop")  # an embedding or a score: its result is in
            elif req.params.max_new_tokens == 0:
                self.finish(req, "length")  # prefill only (e.g. warming a shared prefix)
            elif req.state is ReqState.RUNNING and req in finished_prefill:
                self.kv.cache_unfinished(req)  # others with this prompt hit it from now on

    def _verify_drafts(self, out: StepOutputs, r: SampleResult, j: int) -> None:
        """Keep each draft's prefix the model chose too, then the model's own token at the first
        position it did not (rejection sampling for sampled requests: runtime/sampler.verify_draft);
        the rejected positions' KV slots go back (runtime/sampling/speculative.py). r's rows from j on are
        the drafts' positions, in order."""
        for req, draft, forced in out.drafts:
            rows, j = range(j, j + len(draft) + 1), j + len(draft) + 1
            if req.state is not ReqState.RUNNING:
                continue
            n = accepted(draft, [r.token_ids[i] for i in rows])
            self.accepted_forced_tokens += min(n, forced)
            self.accepted_draft_tokens += n - min(n, forced)
            self.kv.verified(req, req.kv_len - len(draft) + n)
            for i in rows[: n + 1]:
                self._append(req, r.token_ids[i], r.logprobs[i], r.top_logprobs[i])
                if req.state is not ReqState.RUNNING:
                    break  # a stop inside the draft: the rest is not the request's

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
        params = req.params
        if params.return_logprob:
            assert logprob is not None
            if req.logprobs is None:
                req.logprobs = Logprobs()
            req.logprobs.output_token_logprobs.append((logprob, token))
            if top is not None:
                req.logprobs.output_top_logprobs.append(top)
        if req.grammar is not None:
            if not req.grammar.accept_token(token):  # the mask allowed it: this would be a bug
                self.finish(req, "abort", error=f"the output constraint rejected token {token}")
                return
            if req.grammar.is_terminated():  # the constraint is complete and its stop token chosen
                req.matched_stop = token
                self.finish(req, "stop")
                return
        armed = len(req.output_ids) >= params.min_new_tokens  # stops count from min_new_tokens on
        if armed and ((not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids):
            if params.no_stop_trim:
                req.detok.add(token, check_stops=False)  # the stop token's text stays in the output
            req.matched_stop = token
            self.finish(req, "stop")
            return
        if req.detok.add(token, check_stops=armed):
            req.matched_stop = req.detok.matched_stop
            self.finish(req, "stop")
            return
        if len(req.output_ids) >= params.max_new_tokens or req.seq_len >= self.context_len:
            self.finish(req, "length")
            return
        if req.stream:
            self.outbox.append((req.sink, req.snapshot(req.detok.take_delta(final=False))))

    # -- finishing ----------------------------------------------------------------------------------

    def finish(self, req: Req, reason: str, error: str | None = None) -> None:
        if req.state is ReqState.FINISHED:
            return
        req.finish_reason = reason
        req.error = error
        self.scheduler.remove(req)
        self.emit_final(req)

    def emit_final(self, req: Req) -> None:
        if req.matched_stop is None or isinstance(req.matched_stop, int):
            req.detok.flush()
        delta = req.detok.take_delta(final=True)
        self.requests.pop(req.rid, None)
        if req.lora is not None:  # every end of a request passes here once: its adapter is free of it
            req.lora.release()
            req.lora = None
        self.outbox.append((req.sink, req.snapshot(delta)))

    def abort_all(self, message: str) -> None:
        for req in list(self.requests.values()):
            if req.state is not ReqState.FINISHED:
                req.error = message
                req.finish_reason = "abort"
                req.state = ReqState.FINISHED
                self.emit_final(req)
