"""The pipeline's answer in Ollama's shapes: one JSON object (`stream: false`) or NDJSON lines, each
`{"model", "created_at", "message" | "response", "done": false}`, then a last one with `done: true`,
`done_reason` and the counts and durations (nanoseconds) Ollama reports. Tool calls come whole, with
their arguments as an object, in a line of their own before the last. An error inside a stream is a
last `{"error": ...}` line (the Python client raises it)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec

from runtime import Output
from server.common.errors import APIError
from server.ollama.errors import error_line
from server.pipeline.chat import ChatPlan, ChoiceStream
from server.pipeline.request import AssistantMessage, ToolCall, ToolCallFunction


class Clock:
    """A request's durations as Ollama reports them."""

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.first: int | None = None

    def seen(self, out: Output) -> None:
        if self.first is None and out.token_ids:
            self.first = time.perf_counter_ns()

    def stats(self, out: Output) -> dict[str, object]:
        now = time.perf_counter_ns()
        first = self.first or now
        return {"done_reason": "length" if out.finish_reason == "length" else "stop",
                "total_duration": now - self.start, "load_duration": 0,
                "prompt_eval_count": out.prompt_tokens, "prompt_eval_duration": first - self.start,
                "eval_count": out.completion_tokens, "eval_duration": now - first}


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def tool_calls(calls: list[ToolCall]) -> list[dict[str, object]]:
    """Calls with their arguments as objects; one cut short by num_predict is left out."""
    shaped = []
    for index, call in enumerate(calls):
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            continue
        shaped.append({"id": call.id, "function": {"index": index, "name": call.function.name,
                                                   "arguments": arguments}})
    return shaped


def chat_message(message: AssistantMessage) -> dict[str, object]:
    shaped: dict[str, object] = {"role": "assistant", "content": message.content or ""}
    if message.reasoning_content:
        shaped["thinking"] = message.reasoning_content
    if message.tool_calls:
        shaped["tool_calls"] = tool_calls(message.tool_calls)
    return shaped


def chat_object(model: str, message: AssistantMessage, out: Output, clock: Clock) -> dict[str, object]:
    return {"model": model, "created_at": created_at(), "message": chat_message(message), "done": True,
            **clock.stats(out)}


def generate_object(model: str, message: AssistantMessage, out: Output, clock: Clock) -> dict[str, object]:
    shaped: dict[str, object] = {"model": model, "created_at": created_at(), "response": message.content or ""}
    if message.reasoning_content:
        shaped["thinking"] = message.reasoning_content
    return {**shaped, "done": True, **clock.stats(out)}


async def lines(model: str, plan: ChatPlan, stream: AsyncIterator[Output], clock: Clock,
                chat: bool) -> AsyncIterator[dict[str, object]]:
    """The streamed answer: text and thinking as they come, calls whole, then the last line."""
    choice = ChoiceStream(plan)
    calls: dict[int, ToolCall] = {}
    async for out in stream:
        if out.error:
            raise APIError(500, out.error)
        clock.seen(out)
        for delta in choice.feed(out.delta_text, final=out.finished):
            for call in delta.tool_calls or []:
                fn = call.function
                if call.index not in calls:
                    name = (fn.name if fn else None) or ""
                    calls[call.index] = ToolCall(id=call.id or "", function=ToolCallFunction(name, ""))
                calls[call.index].function.arguments += (fn.arguments if fn else None) or ""
            if delta.content or delta.reasoning_content:
                yield _part(model, chat, delta.content or "", delta.reasoning_content)
        if out.finished:
            if calls:
                message = {"role": "assistant", "content": "", "tool_calls": tool_calls(list(calls.values()))}
                yield {"model": model, "created_at": created_at(), "message": message, "done": False}
            last = _part(model, chat, "", None)
            yield {**last, "done": True, **clock.stats(out)}


def _part(model: str, chat: bool, text: str, thinking: str | None) -> dict[str, object]:
    shaped: dict[str, object] = {"model": model, "created_at": created_at()}
    if chat:
        message: dict[str, object] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        shaped["message"] = message
    else:
        shaped["response"] = text
        if thinking:
            shaped["thinking"] = thinking
    shaped["done"] = False
    return shaped


async def ndjson(events: AsyncIterator[dict[str, object]]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield msgspec.json.encode(event) + b"\n"
    except APIError as exc:
        yield error_line(exc.message)
