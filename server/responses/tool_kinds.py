"""The Responses API's kinds of tool, as the chat pipeline's functions and back.

What coding agents send (OpenAI's Codex CLI among them) besides plain `function` tools:
- `namespace`: a group of function (or custom) tools; the model sees each as `namespace.name`
  (a dot, which OpenAI's function names cannot hold, so no plain function collides), and its call
  comes back as a `function_call` with `name` and `namespace` apart;
- `custom`: a free-form tool whose input is text; the model sees a function of one string
  argument `input` (held to the tool's regex when its format gives one; a Lark grammar is not
  enforced), and its call comes back as a `custom_tool_call` with that `input`;
- hosted tools (`web_search`, `file_search`, `code_interpreter`, ...): run by OpenAI's servers,
  not by a model server; accepted and not shown to the model, so it never calls them.
Input items on later turns go the other way (`function_call` with a namespace, `custom_tool_call`
and `custom_tool_call_output`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from server.common.errors import APIError
from server.pipeline.request import FunctionDef, Tool
from server.responses.protocol import FunctionTool

# Tools OpenAI's servers run themselves: accepted, not shown to the model (a model server cannot run them)
HOSTED_TOOLS = {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                "file_search", "code_interpreter", "image_generation", "computer_use", "computer_use_preview", "mcp",
                "local_shell", "shell", "apply_patch", "tool_search"}
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                     "additionalProperties": False}


@dataclass
class ToolNames:
    """How the model's function names map back to the request's tools."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # "ns.name" -> (ns, name)
    custom: set[str] = field(default_factory=set)  # the model's names of custom tools

    def model_name(self, name: str, namespace: str | None) -> str:
        return f"{namespace}.{name}" if namespace else name

    def qualify(self, item: dict[str, object]) -> dict[str, object]:
        """A `function_call` output item as the request's tool kinds say (a new dict)."""
        if item.get("type") != "function_call":
            return item
        name = str(item["name"])
        if name in self.custom:
            return {"type": "custom_tool_call", "id": item["id"], "call_id": item["call_id"],
                    "name": self.namespaced.get(name, (None, name))[1], "input": _custom_input(str(item["arguments"])),
                    "status": item["status"], **self._namespace(name)}
        if name in self.namespaced:
            return {**item, "name": self.namespaced[name][1], **self._namespace(name)}
        return item

    def _namespace(self, name: str) -> dict[str, str]:
        return {"namespace": self.namespaced[name][0]} if name in self.namespaced else {}

    async def events(self, events: AsyncIterator[dict[str, object]]) -> AsyncIterator[dict[str, object]]:
        """The streamed events with their items qualified; a custom call's input comes whole, at its end."""
        custom_items: set[object] = set()
        async for event in events:
            kind = event["type"]
            if isinstance(event.get("item"), dict):
                item = self.qualify(event["item"])  # type: ignore[arg-type]
                if item["type"] == "custom_tool_call":
                    custom_items.add(item["id"])
                    if kind == "response.output_item.added":
                        item = {**item, "input": ""}
                event = {**event, "item": item}
            elif kind == "response.function_call_arguments.delta" and event["item_id"] in custom_items:
                continue  # a JSON fragment of {"input": ...}, not the input's own text
            elif kind == "response.function_call_arguments.done":
                name = str(event["name"])
                if event["item_id"] in custom_items:
                    event = {"type": "response.custom_tool_call_input.done", "item_id": event["item_id"],
                             "output_index": event["output_index"], "input": _custom_input(str(event["arguments"]))}
                elif name in self.namespaced:
                    event = {**event, "name": self.namespaced[name][1]}
            elif isinstance(event.get("response"), dict):
                response = event["response"]
                event = {**event, "response": {**response, "output": [self.qualify(i) for i in response["output"]]}}  # type: ignore[index]
            yield event


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # cut short: the text as it came
    return str(value.get("input", "")) if isinstance(value, dict) else arguments


def chat_tools(tools: list[FunctionTool] | None) -> tuple[list[Tool] | None, ToolNames]:
    """The request's tools as chat functions, and the names to map the model's calls back by."""
    names = ToolNames()
    if not tools:
        return None, names
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.type == "namespace":
            if not tool.name:
                raise APIError(400, f"{where}.name is required", f"{where}.name")
            for j, member in enumerate(tool.tools or []):
                out.append(_function(member, f"{where}.tools[{j}]", names, tool.name))
        elif tool.type in ("function", "custom"):
            out.append(_function(tool, where, names, None))
        elif tool.type not in HOSTED_TOOLS:
            raise APIError(400, f"{where}.type: unknown tool type {tool.type!r} (function, custom, namespace, or one "
                                f"of OpenAI's hosted tools: {', '.join(sorted(HOSTED_TOOLS))})", f"{where}.type")
    if len({t.function.name for t in out}) != len(out):
        raise APIError(400, "tools: two tools have the same name", "tools")
    return out or None, names


def _function(tool: FunctionTool, where: str, names: ToolNames, namespace: str | None) -> Tool:
    if tool.type not in ("function", "custom"):
        raise APIError(400, f"{where}.type: a namespace holds function and custom tools, got {tool.type!r}",
                       f"{where}.type")
    if not tool.name:
        raise APIError(400, f"{where}.name is required", f"{where}.name")
    name = names.model_name(tool.name, namespace)
    if namespace:
        names.namespaced[name] = (namespace, tool.name)
    parameters = tool.parameters
    if tool.type == "custom":
        names.custom.add(name)
        parameters = _custom_parameters(tool.format)
    return Tool(type="function", function=FunctionDef(name=name, description=tool.description, parameters=parameters,
                                                      strict=tool.strict))


def _custom_parameters(fmt: dict[str, object] | None) -> dict[str, object]:
    """One string argument, held to the tool's regex where its format is one."""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("syntax") == "regex":
        return {**CUSTOM_PARAMETERS, "properties": {"input": {"type": "string", "pattern": fmt.get("definition")}}}
    return CUSTOM_PARAMETERS
