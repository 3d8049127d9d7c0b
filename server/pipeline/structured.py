"""Structured output on the OpenAI routes: `response_format`, `tools` + `tool_choice`, and SGLang's
`regex` / `ebnf` extensions, turned into one engine constraint (runtime/sampling/grammar.py).

- `response_format`: `text` (no constraint), `json_object` (an object), `json_schema` (its
  `schema`; `strict` is how we always decode: the schema's own rules, no extra properties).
- `tools` with `tool_choice` naming a function: the output is that function's arguments, as JSON
  constrained to its `parameters` schema. `"required"`: a JSON list of one or more objects,
  each naming one of the tools and its arguments (one only when `parallel_tool_calls` is
  false). `"none"`: plain text. `"auto"` (the default when tools are given): the text is free
  and the model's own tool-call format is parsed out of it (server/parsers/tools/); the chat
  pipeline adds the structural tag that holds a started call to the tools' schemas.
- `strict: true` on a function: objects in its schema take no properties the schema does not
  name (additionalProperties false where the schema leaves it open), as OpenAI's strict mode.
- Fields that would change the answer but are not implemented (`logit_bias`, the deprecated
  `functions`, vLLM's `guided_*`, ...: server/pipeline/fields.py) are a 400 naming the field,
  not silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from server.common.errors import APIError
from server.parsers.tools import ToolSpec
from server.pipeline.fields import REFUSED, refuse_set
from server.pipeline.request import ChatCompletionRequest, SamplingFields, Tool


@dataclass
class Constraint:
    params: dict[str, object]  # extra sampling parameters: {"json_schema": ...} / {"regex": ...} / {}
    tool: str | None = None  # "named" or "required" when the output is a tool call; "auto" when it may be
    function: str | None = None  # the function a named tool choice calls


def refuse_unimplemented(body: SamplingFields) -> None:
    refuse_set(body, REFUSED)


def constraint_for(body: SamplingFields) -> Constraint:
    """The single output constraint this request asks for (a 400 when it asks for two or a bad one)."""
    refuse_unimplemented(body)
    found: list[tuple[str, Constraint]] = []
    if body.response_format is not None:
        c = _response_format(body)
        if c.params:
            found.append(("response_format", c))
    if body.regex is not None:
        found.append(("regex", Constraint({"regex": body.regex})))
    if body.ebnf is not None:
        found.append(("ebnf", Constraint({"ebnf": body.ebnf})))
    auto = None
    if isinstance(body, ChatCompletionRequest):
        c = _tools(body)
        if c.tool == "auto":
            auto = c  # only when nothing else constrains the output: then the text stays free
        elif c.tool is not None:
            found.append(("tool_choice", c))
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise APIError(400, f"{names}: give at most one output constraint", found[1][0])
    return found[0][1] if found else auto or Constraint({})


def _response_format(body: SamplingFields) -> Constraint:
    fmt = body.response_format
    assert fmt is not None
    if fmt.type == "text":
        return Constraint({})
    if fmt.type == "json_object":
        return Constraint({"json_schema": '{"type": "object"}'})
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema is None:
            raise APIError(400, "response_format.json_schema.schema is required for type json_schema",
                           "response_format.json_schema.schema")
        return Constraint({"json_schema": json.dumps(fmt.json_schema.schema)})
    raise APIError(400, f"response_format.type must be text, json_object or json_schema, got {fmt.type!r}",
                   "response_format.type")


def _tools(body: ChatCompletionRequest) -> Constraint:
    tools = body.tools or []
    choice = body.tool_choice
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise APIError(400, f"tools[{i}].type must be function, got {tool.type!r}", f"tools[{i}].type")
        params = tool.function.parameters
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON Schema of an object "
                                f"(type object), got {params!r}"[:300], f"tools[{i}].function.parameters")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", "tools")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return Constraint({})
    if not tools:
        raise APIError(400, "tool_choice needs tools", "tool_choice")
    if choice == "auto":
        return Constraint({}, tool="auto")
    if choice == "required":
        schema = required_calls_schema(tools, parallel=body.parallel_tool_calls is not False)
        return Constraint({"json_schema": json.dumps(schema)}, tool="required")
    if isinstance(choice, str):
        raise APIError(400, f"tool_choice must be none, auto, required or a named function, got {choice!r}",
                       "tool_choice")
    if choice.type != "function" or choice.function.name not in names:
        raise APIError(400, f"tool_choice names function {choice.function.name!r}, which is not in tools",
                       "tool_choice")
    tool = tools[names.index(choice.function.name)]
    return Constraint({"json_schema": json.dumps(_parameters(tool))}, tool="named", function=tool.function.name)


def required_calls_schema(tools: list[Tool], parallel: bool = True) -> dict:
    """tool_choice "required": a JSON list of one call or more (one when not parallel), each
    `{"name": ..., "arguments": ...}` of one of the tools. Each tool's parameters schema moves
    whole under the root's `$defs` and its local references (`#/$defs/X`, `#`, any `#/...`)
    are rewritten to point there, since a reference resolves from the root of the schema it
    sits in, and that root is now this list."""
    defs: dict[str, object] = {}
    options = []
    for i, tool in enumerate(tools):
        key = f"tool{i}_parameters"
        defs[key] = _rebased(_parameters(tool), f"#/$defs/{key}")
        options.append({"type": "object", "properties": {"name": {"const": tool.function.name},
                                                         "arguments": {"$ref": f"#/$defs/{key}"}},
                        "required": ["name", "arguments"], "additionalProperties": False})
    item = options[0] if len(options) == 1 else {"anyOf": options}
    schema: dict[str, object] = {"type": "array", "items": item, "minItems": 1, "$defs": defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _rebased(schema: object, root: str) -> object:
    """The schema with every local `$ref` ("#..." JSON pointer) moved under `root`."""
    if isinstance(schema, list):
        return [_rebased(s, root) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebased(v, root) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = root + ref[1:]
    return out


def _parameters(tool: Tool) -> dict:
    schema = tool.function.parameters or {"type": "object", "properties": {}}
    return _closed(schema) if tool.function.strict else schema


def _closed(schema: object) -> object:
    """Strict mode: every object schema without its own additionalProperties gets false."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def tool_specs(body: ChatCompletionRequest) -> list[ToolSpec]:
    """The request's tools as the parsers and the grammar take them (strict applied)."""
    return [ToolSpec(t.function.name, _parameters(t)) for t in body.tools or []]


def chat_tools(body: ChatCompletionRequest) -> list[dict[str, object]] | None:
    """Tools as chat templates take them (templates that know tools render them into the prompt)."""
    if not body.tools:
        return None
    return [{"type": "function", "function": {k: v for k, v in (("name", t.function.name),
                                                                  ("description", t.function.description),
                                                                  ("parameters", t.function.parameters))
                                              if v is not None}} for t in body.tools]
