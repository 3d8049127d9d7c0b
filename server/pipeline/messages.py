"""Decode: a chat request's messages as chat templates take them, and the prompt they render to.

Every protocol room hands the pipeline a chat request (server/pipeline/request.py); this is where
its messages are checked (a 400 naming the message that is wrong) and rendered with the model's
chat template, for the prompt (server/pipeline/chat.py), for the prefixes a client asks to keep
(server/pipeline/retention.py) and for a stored turn's continuation (server/responses/).
"""

from __future__ import annotations

import json

from runtime.text.tokenizer import Tokenizer
from server.common.errors import APIError
from server.pipeline.request import ChatCompletionRequest
from server.pipeline.structured import chat_tools

KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool"}


def render_prompt(tokenizer: Tokenizer, body: ChatCompletionRequest, add_generation_prompt: bool,
                  continue_final: bool = False) -> str:
    """The request's messages (and tools) through the model's chat template. ValueError: the
    template refused them. `continue_final`: the last message's turn is left open, ending at its
    text, so the model goes on from it (vLLM's and SGLang's continue_final_message)."""
    renders_calls = "tool_calls" in (tokenizer.chat_template or "")
    messages = chat_messages(body, renders_calls)
    if continue_final and add_generation_prompt:
        raise APIError(400, "continue_final_message continues the last message: send add_generation_prompt "
                            "false with it", "continue_final_message")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt, chat_tools(body), body.chat_template_kwargs)
    return _open_final(prompt, messages[-1]) if continue_final else prompt


def _open_final(prompt: str, final: dict[str, object]) -> str:
    """The rendered prompt cut just after the final message's text (what the template writes to
    close its turn goes). Templates may strip the text: the cut keeps whatever of its surrounding
    whitespace the template wrote."""
    text = final.get("content")
    if not isinstance(text, str) or not text.strip():
        raise APIError(400, "continue_final_message needs a final message with text to continue",
                       "continue_final_message")
    at = prompt.rfind(text.strip())
    if at < 0:
        raise APIError(400, "continue_final_message: the chat template does not show the final message's text "
                            "as given, so it cannot be continued", "continue_final_message")
    end = at + len(text.strip())
    trailing = text[len(text.rstrip()):]
    if trailing and prompt.startswith(trailing, end):
        end += len(trailing)  # the template kept the text's own trailing whitespace: so do we
    return prompt[:end]


def chat_messages(body: ChatCompletionRequest, template_renders_calls: bool = False) -> list[dict[str, object]]:
    """The request's messages as chat templates take them (a 400 naming the message that is wrong).
    `template_renders_calls`: the chat template writes an assistant turn's tool_calls itself."""
    if not body.messages:
        raise APIError(400, "messages must not be empty", "messages")
    messages = []
    call_ids: set[str] = set()
    for i, message in enumerate(body.messages):
        if message.role not in KNOWN_ROLES:
            raise APIError(400, f"messages[{i}].role: unknown role {message.role!r}; use one of "
                                f"{sorted(KNOWN_ROLES)}", f"messages[{i}].role")
        content = message.content
        if message.tool_calls and message.role != "assistant":
            raise APIError(400, f"messages[{i}].tool_calls: only assistant messages call tools",
                           f"messages[{i}].tool_calls")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
                parts.append(part.text)
            content = "".join(parts)
        entry: dict[str, object] = {"role": "system" if message.role == "developer" else message.role}
        if message.tool_calls:
            calls = [{"type": "function", "id": c.id,
                      "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                     for c in message.tool_calls]
            call_ids.update(c.id for c in message.tool_calls)
            entry["tool_calls"] = calls
            # Templates that do not render tool calls still show the model what was called; one that
            # does must not see the calls twice (a small model then imitates the doubled turn:
            # Qwen2.5-Coder-0.5B answered a tool result with the same call again, as a JSON list).
            if content is None:
                content = "" if template_renders_calls else json.dumps([c["function"] for c in calls])
        if message.role == "tool" and message.tool_call_id is not None and message.tool_call_id not in call_ids:
            raise APIError(400, f"messages[{i}].tool_call_id: {message.tool_call_id!r} answers no earlier "
                                "assistant tool call", f"messages[{i}].tool_call_id")
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None and message.role == "tool":
            entry["name"] = message.name
        if message.reasoning_content is not None and message.role == "assistant":
            entry["reasoning_content"] = message.reasoning_content
        if content is None:
            raise APIError(400, f"messages[{i}].content is required", f"messages[{i}].content")
        entry["content"] = content
        messages.append(entry)
    return messages


def _arguments(text: str) -> object:
    """A call's arguments as templates take them: the JSON value, or the text itself when it is
    not JSON (a call cut by max_tokens that a client sends back; OpenAI takes it too)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
