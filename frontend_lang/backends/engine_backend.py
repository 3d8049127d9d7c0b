"""The in-process backend: programs call an `Engine` directly."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator

from frontend_lang.backends.base import Backend, BackendError, Completion, Prompt, common_prefix_len
from frontend_lang.chat_template import Render
from runtime import Engine


class EngineBackend(Backend):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.chat_stop_strings = list(engine.tokenizer.chat_stop_strings)

    def renderer(self) -> Render | None:
        tok = self.engine.tokenizer
        if not tok.has_chat_template:
            return None
        return lambda messages, add_generation_prompt: tok.apply_chat_template(messages, add_generation_prompt)

    def generate(self, prompt: Prompt, params: dict[str, object]) -> Completion:
        outs = self.engine.generate(input_ids=self.engine.encode(prompt.text), sampling_params=_engine_params(params),
                                    lora=params.get("lora"))
        out = outs[0]
        for failed in outs:
            if failed.error:
                raise BackendError(failed.error)
        meta: dict[str, object] = {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                                   "cached_tokens": out.cached_tokens, "finish_reason": out.finish_reason}
        if out.logprobs is not None:
            meta["output_token_logprobs"] = list(out.logprobs.output_token_logprobs)
            meta["input_token_logprobs"] = list(out.logprobs.input_token_logprobs)
            if out.logprobs.output_top_logprobs:
                meta["output_top_logprobs"] = list(out.logprobs.output_top_logprobs)
        return Completion(out.text, meta, [o.text for o in outs] if len(outs) > 1 else [])

    def stream(self, prompt: Prompt, params: dict[str, object]) -> Iterator[str]:
        deltas: queue.Queue[object] = queue.Queue()

        async def pump() -> None:
            try:
                async for out in self.engine.stream(input_ids=self.engine.encode(prompt.text),
                                                    sampling_params=_engine_params(params), lora=params.get("lora")):
                    if out.error:
                        raise BackendError(out.error)
                    deltas.put(out.delta_text)
            except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                deltas.put(exc)
            deltas.put(None)

        threading.Thread(target=lambda: asyncio.run(pump()), daemon=True).start()
        while (item := deltas.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]

    def choice_logprobs(self, prompt: Prompt, choices: list[str]) -> list[list[float]]:
        base = self.engine.encode(prompt.text)
        batch, starts = [], []
        for choice in choices:
            ids = self.engine.encode(prompt.text + choice)
            start = min(common_prefix_len(base, ids), len(ids) - 1)
            batch.append(ids)
            starts.append(start)
        # One batch: the shared prefix is computed once and the choices reuse it from the cache.
        params = [{"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": s} for s in starts]
        outs = self.engine.generate(input_ids=batch, sampling_params=params)
        scores = []
        for out in outs:
            if out.error or out.logprobs is None:
                raise BackendError(out.error or "no logprobs returned")
            scores.append([v for v, _ in out.logprobs.input_token_logprobs if v is not None])
        return scores

    def unconditional_logprobs(self, choices: list[str]) -> list[list[float]]:
        params = {"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
        outs = self.engine.generate(input_ids=[self.engine.encode(c) for c in choices], sampling_params=params)
        return [[v or 0.0 for v, _ in out.logprobs.input_token_logprobs] if out.logprobs else [] for out in outs]

    def warm(self, text: str) -> None:
        self.engine.generate(input_ids=self.engine.encode(text), sampling_params={"max_new_tokens": 0})

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def server_info(self) -> dict[str, object]:
        return {**vars(self.engine.args), "stats": self.engine.stats()}


def _engine_params(params: dict[str, object]) -> dict[str, object]:
    """The request fields that are not sampling parameters of the engine: texts in logprobs are a
    server-side formatting choice (the engine's logprobs carry token ids); the LoRA adapter is the
    request's, not a sampling parameter."""
    return {k: v for k, v in params.items() if k not in ("return_text_in_logprobs", "lora")}
