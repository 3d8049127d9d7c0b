"""An Anthropic Messages request -> the chat pipeline's protocol-free chat request.

Every check here names Anthropic's own field (`messages[2].content[0].tool_use_id`), so the pipeline
below never has to report a translated message's index. What a coding agent's traffic needs to keep
its prefix cached turn after turn:

- the per-request nonce Claude Code writes into its first system block
  (`x-anthropic-billing-header: cc_version=...; cch=...;`) is dropped before the template: it is
  billing metadata, not instructions, and it changes on every request at the very start of the
  prompt, where it would defeat every cached token after it;
- a `system` (or `developer`) message inside `messages` stays where it was sent, as a
  `<system-reminder>` in the user's turn (Claude Code sends one after the user's turn; moving it into
  the system prompt would change the prompt's first tokens whenever it comes or goes, and most chat
  templates refuse a system turn in mid-conversation);
- content renders the same whether or not a block carries `cache_control`: blocks are joined into
  one text per turn and the marks travel beside it (so rolling breakpoints never change the tokens).
"""

from __future__ import annotations

import json
import re

from server.anthropic.protocol import ContentBlock, CountTokensRequest, MessagesRequest, ToolDef
from server.common.errors import APIError
from server.pipeline.request import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallFunction,
)
from server.pipeline.retention import CACHE_TTLS, cache_control_ttl

BILLING_HEADER = re.compile(r"^x-anthropic-billing-header:[^\n]*(\n|$)", re.MULTILINE)
SEPARATOR = "\n\n"  # between the text blocks of one turn
SYSTEM_ROLES = {"system", "developer"}


def chat_request(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request a Messages (or count_tokens) body asks for; a 400 naming the field otherwise."""
    messages: list[ChatMessage] = []
    system, marks = _system(body)
    for i, message in enumerate(body.messages):
        _message(messages, message.role, _blocks(message.content), f"messages[{i}]", system is None and i == 0)
    if not messages:
        raise APIError(400, "messages: at least one message is required", "messages")
    if messages[-1].role == "assistant":
        raise APIError(400, "messages: the last message must be the user's (continuing an assistant prefill is "
                            "not supported)", "messages")
    if system is not None:
        messages.insert(0, ChatMessage(role="system", content=system))
    tools, tool_marks = _tools(body.tools)
    marks += tool_marks  # tools render with the system prompt: their mark keeps that much
    if marks:
        messages[0].cache_control = _control_of(marks + _marks_of(messages[0]))
    automatic = _ttl(body, "")  # top-level cache_control: a mark on the last block
    if automatic:
        messages[-1].cache_control = _control_of(automatic + _marks_of(messages[-1]))
    fields: dict[str, object] = {}
    if isinstance(body, MessagesRequest):
        if not 1 <= body.max_tokens < 2**31:  # past the context window is fine (routes.py); past this is not a number
            raise APIError(400, f"max_tokens: must be in [1, 2**31), got {body.max_tokens}", "max_tokens")
        fields = dict(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                      stop=list(body.stop_sequences or []),
                      user=body.metadata.user_id if body.metadata is not None else None)
    choice, parallel = _tool_choice(body)
    return ChatCompletionRequest(messages=messages, tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                                 chat_template_kwargs=_thinking(body), response_format=_format(body),
                                 **fields)  # type: ignore[arg-type]


def strip_billing_header(text: str) -> str:
    return BILLING_HEADER.sub("", text)


# -- system ---------------------------------------------------------------------------------------------


def _system(body: CountTokensRequest) -> tuple[str | None, list[str]]:
    """The system prompt's text (nonce stripped) and the TTLs of its cache_control marks."""
    if body.system is None:
        return None, []
    blocks = [ContentBlock(type="text", text=body.system)] if isinstance(body.system, str) else body.system
    texts, marks = [], []
    for j, block in enumerate(blocks):
        where = f"system[{j}]" if not isinstance(body.system, str) else "system"
        if block.type != "text" or block.text is None:
            raise APIError(400, f"{where}.type: system blocks must be text, got {block.type!r}", f"{where}.type")
        marks += _ttl(block, where)
        text = strip_billing_header(block.text)
        if text.strip():
            texts.append(text)
    return (SEPARATOR.join(texts) if texts else None), marks


# -- messages -------------------------------------------------------------------------------------------


def _blocks(content: str | list[ContentBlock]) -> list[ContentBlock]:
    return [ContentBlock(type="text", text=content)] if isinstance(content, str) else content


def _message(out: list[ChatMessage], role: str, blocks: list[ContentBlock], where: str, first: bool) -> None:
    if role == "assistant":
        out.append(_assistant(blocks, where))
    elif role == "user":
        _user(out, blocks, where)
    elif role in SYSTEM_ROLES:
        text, marks = _text(blocks, f"{where}.content")
        if first:  # a system turn before anything else is the system prompt itself
            out.append(ChatMessage(role="system", content=text, cache_control=_control_of(marks)))
        else:
            _add_user_text(out, f"<system-reminder>\n{text}\n</system-reminder>", marks)
    else:
        raise APIError(400, f"{where}.role: unknown role {role!r}; use user or assistant (or system)", f"{where}.role")


def _assistant(blocks: list[ContentBlock], where: str) -> ChatMessage:
    texts, reasoning, calls, marks = [], [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        marks += _ttl(block, at)
        if block.type == "text":
            texts.append(_required(block.text, f"{at}.text"))
        elif block.type == "tool_use":
            name = _required(block.name, f"{at}.name")
            call_id = _required(block.id, f"{at}.id")
            arguments = json.dumps(block.input if block.input is not None else {}, ensure_ascii=False)
            calls.append(ToolCall(id=call_id, function=ToolCallFunction(name, arguments)))
        elif block.type == "thinking":
            reasoning.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue  # encrypted by Anthropic for Anthropic's models: nothing this model can read
        else:
            raise APIError(400, f"{at}.type: an assistant turn holds text, tool_use and thinking blocks, "
                                f"got {block.type!r}", f"{at}.type")
    content = SEPARATOR.join(texts) if texts or not calls else None
    return ChatMessage(role="assistant", content=content, tool_calls=calls or None,
                       reasoning_content="".join(reasoning) or None, cache_control=_control_of(marks))


def _user(out: list[ChatMessage], blocks: list[ContentBlock], where: str) -> None:
    """Tool results become tool turns (in order); the text blocks one user turn after them."""
    calls = {c.id: c.function.name for m in out for c in m.tool_calls or []}
    texts, marks = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "tool_result":
            call_id = _required(block.tool_use_id, f"{at}.tool_use_id")
            if call_id not in calls:
                raise APIError(400, f"{at}.tool_use_id: {call_id!r} answers no tool_use of an earlier assistant "
                                    "turn", f"{at}.tool_use_id")
            result, result_marks = _result_text(block, at)
            result_marks += _ttl(block, at)
            if block.is_error:
                result = f"Error: {result}"
            out.append(ChatMessage(role="tool", tool_call_id=call_id, name=calls[call_id], content=result,
                                   cache_control=_control_of(result_marks)))
        elif block.type == "text":
            texts.append(_required(block.text, f"{at}.text"))
            marks += _ttl(block, at)
        else:
            raise APIError(400, f"{at}.type: a user turn holds text and tool_result blocks, got {block.type!r} "
                                "(this server reads text only)", f"{at}.type")
    if texts:
        _add_user_text(out, SEPARATOR.join(texts), marks)
    elif marks:  # a mark on text-less content: keep the turn it is in
        out[-1].cache_control = _control_of(marks + _marks_of(out[-1]))


def _result_text(block: ContentBlock, where: str) -> tuple[str, list[str]]:
    if block.content is None:
        return "", []
    if isinstance(block.content, str):
        return block.content, []
    return _text(block.content, f"{where}.content")


def _text(blocks: list[ContentBlock], where: str) -> tuple[str, list[str]]:
    """Text blocks joined, and their marks; `where` names the list (`messages[2].content`)."""
    texts, marks = [], []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        if block.type != "text":
            raise APIError(400, f"{at}.type: only text blocks are supported here, got {block.type!r}", f"{at}.type")
        texts.append(_required(block.text, f"{at}.text"))
        marks += _ttl(block, at)
    return SEPARATOR.join(texts), marks


def _add_user_text(out: list[ChatMessage], text: str, marks: list[str]) -> None:
    """Consecutive user texts are one turn (as Anthropic reads them, and as templates that insist on
    alternating turns need)."""
    last = out[-1] if out else None
    if last is not None and last.role == "user":
        last.content = f"{last.content}{SEPARATOR}{text}"
        last.cache_control = _control_of(marks + _marks_of(last))
    else:
        out.append(ChatMessage(role="user", content=text, cache_control=_control_of(marks)))


# -- tools, thinking ------------------------------------------------------------------------------------


def _tools(defs: list[ToolDef] | None) -> tuple[list[Tool] | None, list[str]]:
    if not defs:
        return None, []
    tools, marks = [], []
    for i, tool in enumerate(defs):
        where = f"tools[{i}]"
        marks += _ttl(tool, where)
        if tool.input_schema is None:
            if tool.type not in (None, "custom"):
                continue  # an Anthropic-defined tool (web search, code execution...): not ours to describe or run
            raise APIError(400, f"{where}.input_schema is required", f"{where}.input_schema")
        if tool.input_schema.get("type", "object") != "object":
            raise APIError(400, f"{where}.input_schema: must be a JSON Schema of an object (type object)",
                           f"{where}.input_schema")
        tools.append(Tool(type="function", function=FunctionDef(name=tool.name, description=tool.description,
                                                                parameters=tool.input_schema)))
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: tool names must be unique", "tools")
    return tools or None, marks


def _tool_choice(body: CountTokensRequest) -> tuple[str | NamedToolChoice | None, bool | None]:
    choice = body.tool_choice
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type in ("auto", "none"):
        return choice.type, parallel
    if choice.type == "any":
        return "required", parallel
    if choice.type == "tool":
        names = [t.name for t in body.tools or []]
        if choice.name not in names:
            raise APIError(400, f"tool_choice.name: {choice.name!r} is not one of tools", "tool_choice.name")
        return NamedToolChoice(type="function", function=NamedFunction(choice.name or "")), parallel
    raise APIError(400, f"tool_choice.type: must be auto, any, tool or none, got {choice.type!r}", "tool_choice.type")


def _format(body: CountTokensRequest) -> ResponseFormat | None:
    """`output_config.format` (structured outputs) -> the pipeline's JSON-schema constraint."""
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return None
    if fmt.type != "json_schema" or fmt.schema is None:
        raise APIError(400, "output_config.format: must be {\"type\": \"json_schema\", \"schema\": {...}}",
                       "output_config.format")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(schema=fmt.schema))


def _thinking(body: CountTokensRequest) -> dict[str, object] | None:
    """`thinking` -> the template's switch (Qwen3's `enable_thinking`); the reasoning parser splits the
    thoughts out. The budget is accepted, not enforced: thoughts count against max_tokens."""
    thinking = body.thinking
    if thinking is None:
        return None
    if thinking.type not in ("enabled", "disabled", "adaptive", "between_tools"):
        raise APIError(400, f"thinking.type: must be enabled, disabled, adaptive or between_tools, got "
                            f"{thinking.type!r}", "thinking.type")
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None or budget < 1:
            raise APIError(400, "thinking.budget_tokens: a positive number of tokens is required when thinking is "
                                "enabled", "thinking.budget_tokens")
        if isinstance(body, MessagesRequest) and budget >= body.max_tokens:
            raise APIError(400, f"thinking.budget_tokens: must be less than max_tokens ({body.max_tokens})",
                           "thinking.budget_tokens")
    return {"enable_thinking": thinking.type != "disabled"}


# -- small helpers ----------------------------------------------------------------------------------------


def _required(value: str | None, field: str) -> str:
    if value is None:
        raise APIError(400, f"{field} is required", field)
    return value


def _ttl(block: object, where: str) -> list[str]:
    """The TTL name of a block's cache_control (checked), as a list to collect."""
    control = getattr(block, "cache_control", None)
    if control is None:
        return []
    seconds = cache_control_ttl(control, f"{where}.cache_control" if where else "cache_control")
    return [next(name for name, s in CACHE_TTLS.items() if s == seconds)]


def _control(ttl: str) -> dict[str, object]:
    return {"type": "ephemeral", "ttl": ttl}


def _control_of(marks: list[str]) -> dict[str, object] | None:
    return _control(max(marks, key=lambda m: CACHE_TTLS[m])) if marks else None


def _marks_of(message: ChatMessage) -> list[str]:
    control = message.cache_control
    return [str(control.get("ttl", "5m"))] if control else []
