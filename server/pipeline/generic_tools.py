"""Tools on any model: when the model's chat template has no tool-call format, tools are served the
way llama.cpp's generic handler serves them, instead of a 400.

- The tools, with their argument schemas, are described in the system message (added to the first
  one, or a new one at the start), with the one reply shape the model must use.
- The reply is constrained (a JSON schema through the grammar) to one object that either calls
  tools, `{"tool_calls": [{"name": ..., "arguments": {...}}]}` (exactly one call when parallel
  calls are off), or answers, `{"response": "..."}`; server/parsers/tools/generic.py reads it into
  tool_calls and content, streamed or not.
- Earlier turns are shown in the same shape, so a template that knows nothing of tools can render
  them: an assistant turn's calls (or text) as that JSON, tool results as a user turn of
  `{"tool_response": {"name": ..., "content": ...}}` lines. All of it is a pure function of the
  request, so a conversation's prompt keeps its prefix (and its cache) from turn to turn.

Only tool_choice auto needs this: "required" and a named function are already one JSON shape on
every model (server/pipeline/structured.py). A request can ask for it on any model with
`tool_call_parser: "generic"`.
"""

from __future__ import annotations

import json

import msgspec

from server.common.errors import APIError
from server.common.state import ServerState
from server.parsers.tools import ToolSpec
from server.parsers.tools.generic import CALLS_KEY, RESPONSE_KEY, GenericParser
from server.pipeline.request import ChatCompletionRequest, ChatMessage
from server.pipeline.structured import Constraint, tool_specs

NAME = "generic"


def needed(state: ServerState, body: ChatCompletionRequest) -> bool:
    """Whether a tool_choice auto request is served this way: the model has no tool format (or the
    request asks for this one)."""
    asked = body.tool_call_parser
    if asked == NAME:
        return True
    name = state.tool_call_parser[0] if asked in (None, "auto") else asked
    return name is None or name == "none"


def adapt(body: ChatCompletionRequest) -> tuple[ChatCompletionRequest, Constraint, GenericParser]:
    """The request as a template without tools renders it, the reply's constraint and its parser."""
    specs = tool_specs(body)
    parallel = body.parallel_tool_calls is not False
    messages = _polyfilled(body.messages)
    guide = _guide(body, parallel)
    if messages and messages[0].role in ("system", "developer"):
        first = messages[0]
        messages[0] = msgspec.structs.replace(first, content=f"{_text(first.content)}\n\n{guide}")
    else:
        messages.insert(0, ChatMessage(role="system", content=guide))
    schema = reply_schema(specs, parallel)
    adapted = msgspec.structs.replace(body, messages=messages, tool_call_parser=None)
    return adapted, Constraint({"json_schema": json.dumps(schema)}, tool=NAME), GenericParser(specs)


def reply_schema(specs: list[ToolSpec], parallel: bool) -> dict[str, object]:
    calls = [{"type": "object", "properties": {"name": {"const": s.name}, "arguments": s.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for s in specs]
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    array: dict[str, object] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return {"anyOf": [
        {"type": "object", "properties": {CALLS_KEY: array}, "required": [CALLS_KEY], "additionalProperties": False},
        {"type": "object", "properties": {RESPONSE_KEY: {"type": "string"}}, "required": [RESPONSE_KEY],
         "additionalProperties": False}]}


def _guide(body: ChatCompletionRequest, parallel: bool) -> str:
    tools = [{k: v for k, v in (("name", t.function.name), ("description", t.function.description),
                                ("parameters", t.function.parameters or {"type": "object", "properties": {}}))
              if v is not None} for t in body.tools or []]
    many = "one or more calls" if parallel else "exactly one call"
    return ("You can call these tools (each with the JSON Schema of its arguments):\n"
            f"{json.dumps(tools, ensure_ascii=False)}\n\n"
            "Reply with one JSON object. To call tools (" + many + "; their results come back to you):\n"
            f'{{"{CALLS_KEY}": [{{"name": "<tool name>", "arguments": {{...}}}}]}}\n'
            f'To answer the user instead:\n{{"{RESPONSE_KEY}": "<your answer>"}}')


def _polyfilled(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Calls and results as the reply's JSON, for templates that know no tool turns."""
    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    results = False  # the last message is a user turn made of tool results
    for i, message in enumerate(messages):
        if message.role == "assistant" and (message.tool_calls or message.content is not None):
            calls = message.tool_calls or []
            names.update((c.id, c.function.name) for c in calls)
            reply = ({CALLS_KEY: [{"name": c.function.name, "arguments": _arguments(c.function.arguments)}
                                  for c in calls]} if calls else {RESPONSE_KEY: _text(message.content)})
            out.append(msgspec.structs.replace(message, content=json.dumps(reply, ensure_ascii=False),
                                               tool_calls=None, cache_control=_mark(message)))
            results = False
        elif message.role == "tool":
            if message.tool_call_id is not None and message.tool_call_id not in names:
                raise APIError(400, f"messages[{i}].tool_call_id: {message.tool_call_id!r} answers no earlier "
                                    "assistant tool call", f"messages[{i}].tool_call_id")
            name = message.name or names.get(message.tool_call_id or "", "")
            line = json.dumps({"tool_response": {"name": name, "content": _text(message.content)}},
                              ensure_ascii=False)
            if results:
                out[-1] = msgspec.structs.replace(out[-1], content=f"{out[-1].content}\n{line}",
                                                  cache_control=_mark(message) or out[-1].cache_control)
            else:
                out.append(ChatMessage(role="user", content=line, cache_control=_mark(message)))
            results = True
        elif results and message.role == "user":  # one user turn after the results, as templates alternate
            out[-1] = msgspec.structs.replace(out[-1], content=f"{out[-1].content}\n{_text(message.content)}",
                                              cache_control=_mark(message) or out[-1].cache_control)
            results = False
        else:
            out.append(message)
            results = False
    return out


def _mark(message: ChatMessage) -> dict[str, object] | None:
    """The message's cache_control, or its parts' (their text is joined here)."""
    parts = message.content if isinstance(message.content, list) else []
    return message.cache_control or next((p.cache_control for p in parts if p.cache_control), None)


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(part.text or "" for part in content)
    return content or ""  # type: ignore[return-value]


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
