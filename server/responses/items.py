"""The Responses answer: the chat pipeline's assistant message as output items (`reasoning`,
`message` with `output_text`, `function_call`), the Response object around them, and the
streamed deltas as items and their events."""

from __future__ import annotations

import uuid

import msgspec

from runtime import Output
from server.common.state import ServerState
from server.pipeline.request import AssistantMessage, DeltaMessage
from server.responses.protocol import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- the answer as output items -------------------------------------------------------------------------


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, object]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _reasoning_item(item_id: str, text: str | None) -> dict[str, object]:
    content = [{"type": "reasoning_text", "text": text}] if text is not None else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": "completed"}


def output_items(message: AssistantMessage) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    if message.reasoning_content:
        items.append(_reasoning_item(new_id("rs"), message.reasoning_content))
    if message.content or not items and not message.tool_calls:  # nothing said at all: one empty message
        items.append(_message_item(new_id("msg"), message.content or ""))
    for call in message.tool_calls or []:
        items.append(_call_item(new_id("fc"), call.id, call.function.name, call.function.arguments))
    return items


def _usage(out: Output) -> dict[str, object]:
    # OpenAI's names, and beside them the Chat Completions names SGLang's clients read here too.
    return {"input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": out.cached_tokens},
            "output_tokens": out.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens}


def _status(out: Output | None) -> tuple[str, dict[str, str] | None]:
    if out is None:
        return "in_progress", None
    if out.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if out.finish_reason == "abort":
        return "incomplete", {"reason": "aborted"}
    return "completed", None


def response_object(state: ServerState, rid: str, created: int, body: ResponsesRequest,
                    output: list[dict[str, object]], out: Output | None) -> dict[str, object]:
    status, incomplete = _status(out)
    choice = body.tool_choice
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "background": False,
        "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "model": state.served_model_name, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
        "tool_choice": msgspec.to_builtins(choice) if choice is not None else ("auto" if body.tools else "none"),
        "tools": [msgspec.to_builtins(t) for t in body.tools or []],
        "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": body.truncation or "disabled",
        "usage": _usage(out) if out is not None else None, "user": body.user, "metadata": body.metadata or {},
    }


# -- streaming ---------------------------------------------------------------------------------------------


class ItemStream:
    """The chat pipeline's streamed deltas as Responses output items and their events."""

    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []
        self._open: dict[str, object] | None = None
        self._text = ""

    def feed(self, delta: DeltaMessage) -> list[dict[str, object]]:
        events: list[dict[str, object]] = []
        if delta.reasoning_content:
            events += self.open("reasoning")
            events.append(self._text_event("response.reasoning_text.delta", delta=delta.reasoning_content))
            self._text += delta.reasoning_content
        if delta.content:
            events += self.open("message")
            events.append(self._text_event("response.output_text.delta", delta=delta.content, logprobs=[]))
            self._text += delta.content
        for call in delta.tool_calls or []:
            if call.id is not None:  # a new call: its name first
                events += self.close()
                name = call.function.name if call.function is not None else ""
                events += self._start(_call_item(new_id("fc"), call.id, name or "", "", "in_progress"))
            args = call.function.arguments if call.function is not None else None
            if args:
                events.append({"type": "response.function_call_arguments.delta", "item_id": self._open["id"],
                               "output_index": len(self.items) - 1, "delta": args})
                self._text += args
        return events

    def close(self) -> list[dict[str, object]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index, text, self._text = len(self.items) - 1, self._text, ""
        where = {"item_id": item["id"], "output_index": index}
        events: list[dict[str, object]] = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            events += [{"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []},
                       {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
            self.items[index] = _message_item(item["id"], text)  # type: ignore[arg-type]
        elif item["type"] == "reasoning":
            events.append({"type": "response.reasoning_text.done", **where, "content_index": 0, "text": text})
            self.items[index] = _reasoning_item(item["id"], text)  # type: ignore[arg-type]
        else:
            events.append({"type": "response.function_call_arguments.done", **where, "name": item["name"],
                           "arguments": text})
            self.items[index] = _call_item(item["id"], item["call_id"], item["name"], text)  # type: ignore[arg-type]
        events.append({"type": "response.output_item.done", "output_index": index, "item": self.items[index]})
        return events

    def open(self, kind: str) -> list[dict[str, object]]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self.close()
        if kind == "message":
            item = _message_item(new_id("msg"), "", "in_progress")
            events += self._start(item)
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        else:
            events += self._start({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [],
                                   "status": "in_progress"})
        return events

    def _start(self, item: dict[str, object]) -> list[dict[str, object]]:
        self._open = item
        self.items.append(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": item}]

    def _text_event(self, kind: str, **fields: object) -> dict[str, object]:
        assert self._open is not None
        return {"type": kind, "item_id": self._open["id"], "output_index": len(self.items) - 1, "content_index": 0,
                **fields}

