"""The chat pipeline every protocol room shares. A room decodes its body into a chat request
(server/pipeline/request.py), then the request reads decode -> plan -> run -> render once:

- `plan_chat(state, body)`: the messages through the chat template (server/pipeline/messages.py)
  -> the prompt's token ids; the sampling parameters with the output constraint
  (response_format, a forced tool call, or the structural tag that keeps calls valid under
  tool_choice auto); the parsers its output needs; and the prefixes it asks to retain;
- `run_chat(state, plan)` / `stream_chat(state, plan)`: the engine runs it (the finished outputs,
  or a stream whose submission errors have already raised), and marked prefixes are retained
  once it finished;
- `final_message(plan, out)`: a finished output -> the assistant message (content,
  reasoning_content, tool_calls) and its finish_reason; `ChoiceStream(plan)`: the same,
  streamed: each output's new text -> the deltas to send. The room renders these in its own
  wire format.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from runtime import Output, SamplingParams
from server.common.errors import APIError, bad_request
from server.common.state import ServerState
from server.parsers.reasoning import START as THINK_START
from server.parsers.reasoning import ReasoningParser, StreamingReasoning, reasoning_class
from server.parsers.tools import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    Event,
    StreamingToolParser,
    ToolParser,
    new_call_id,
    parser_class,
    structural_tag,
)
from server.parsers.tools.forced import NamedParser, RequiredParser
from server.pipeline import generic_tools
from server.pipeline.engine_client import PrimedStream, collect, run_request
from server.pipeline.messages import render_prompt
from server.pipeline.request import (
    AssistantMessage,
    ChatCompletionRequest,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    SamplingFields,
    ToolCall,
    ToolCallFunction,
)
from server.pipeline.retention import Retain, chat_request_retains, retain, retaining
from server.pipeline.structured import Constraint, constraint_for, tool_specs


@dataclass
class ChatPlan:
    ids: list[int]
    params: SamplingParams
    constraint: Constraint
    prompt: str  # the rendered chat template
    tool_parser: ToolParser | None = None  # reads calls out of the text (None: the text is all content)
    tool_prefix: str = ""  # call markup the prompt itself opened (parsed with the output, never content)
    reasoning: ReasoningParser | None = None
    retains: list[Retain] = field(default_factory=list)  # cache_control marks (server/pipeline/retention.py)
    cache_salt: str | None = None
    rid: str | None = None  # SGLang's `rid`: the engine's request id, so /abort_request can stop it
    lora: str | None = None  # the LoRA adapter it runs through (the route's choice: ServerState.adapter_for)


def sampling_params(req: SamplingFields, default_max: int, extra_stop: Sequence[str] = (),
                    top_logprobs: int | None = None, constraint: Constraint | None = None,
                    overrides: dict[str, object] | None = None, min_tokens: int = 1) -> SamplingParams:
    """`min_tokens`: the least max_tokens may be (0 where the prompt alone is the point: echo)."""
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    values: dict[str, object] = {
        "max_new_tokens": default_max if max_tokens is None else max_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": -1 if req.top_k is None else req.top_k,
        "min_p": 0.0 if req.min_p is None else req.min_p,
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "stop": stop + [s for s in extra_stop if s not in stop],
        "stop_token_ids": list(req.stop_token_ids or []),
        "stop_regex": [req.stop_regex] if isinstance(req.stop_regex, str) else list(req.stop_regex or []),
        "no_stop_trim": req.no_stop_trim or req.include_stop_str_in_output,
        "ignore_eos": req.ignore_eos,
        "min_new_tokens": req.min_tokens,
        "n": req.n,
        "seed": req.seed,
        "skip_special_tokens": req.skip_special_tokens,
        "return_logprob": top_logprobs is not None,
        "top_logprobs_num": top_logprobs or 0,
        **(constraint.params if constraint is not None else {}),
        **(overrides or {}),
    }
    try:
        params = SamplingParams.from_dict(values)
    except ValueError as exc:
        message = str(exc).replace("max_new_tokens", "max_tokens", 1)
        raise bad_request(ValueError(message)) from exc
    if max_tokens is not None and max_tokens < min_tokens:
        raise APIError(400, f"max_tokens must be >= {min_tokens}, got {max_tokens}", "max_tokens")
    return params


def check_context(state: ServerState, prompt_len: int, body: SamplingFields) -> None:
    """As OpenAI and vLLM do: an explicit max_tokens that cannot fit is an error, not a silent cut."""
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    room = state.engine.context_len - prompt_len
    if asked is not None and asked > room:
        raise APIError(400, f"max_tokens: {asked} tokens requested but this model's context length is "
                            f"{state.engine.context_len} and the prompt has {prompt_len} tokens", "max_tokens")


# -- the plan -------------------------------------------------------------------------------------


def plan_chat(state: ServerState, body: ChatCompletionRequest, top_logprobs: int | None = None) -> ChatPlan:
    engine = state.engine
    tokenizer = engine.tokenizer
    constraint = constraint_for(body)
    generic = None  # tools on a model with no tool format of its own (server/pipeline/generic_tools.py)
    if constraint.tool == "auto" and generic_tools.needed(state, body):
        body, constraint, generic = generic_tools.adapt(body)
    try:
        prompt = render_prompt(tokenizer, body, body.add_generation_prompt, body.continue_final_message)
        ids = tokenizer.encode_rendered(prompt)
    except ValueError as exc:
        raise bad_request(exc) from exc
    plan = ChatPlan(ids, SamplingParams(), constraint, prompt, cache_salt=body.cache_salt, rid=body.rid)
    overrides: dict[str, object] = {}
    specs = tool_specs(body)
    if constraint.tool == "auto":
        plan.tool_parser = _auto_parser(state, body, specs)
        # Only where the grammar then holds the call: else the prompt's text could end up in content.
        prefix = _opened_call(prompt, plan.tool_parser.trigger) if plan.tool_parser.constrained else ""
        if any(plan.tool_parser.call_tag(t, {})[0].startswith(prefix) for t in specs):
            plan.tool_prefix = prefix  # the grammar starts inside the call this opened
        try:
            tag = structural_tag(plan.tool_parser, specs, body.parallel_tool_calls is not False, plan.tool_prefix,
                                 _special_tokens(engine))
        except ValueError as exc:  # a schema the Python-call grammar cannot hold
            raise bad_request(exc) from exc
        if tag is not None:
            constraint.params = {"structural_tag": json.dumps(tag)}
        if plan.tool_parser.needs_special_tokens:
            overrides["skip_special_tokens"] = False  # its markers are special tokens: keep them to parse
    elif constraint.tool == "required":
        plan.tool_parser = RequiredParser(specs)
    elif constraint.tool == "named":
        plan.tool_parser = NamedParser(constraint.function or "", specs)
    elif generic is not None:
        plan.tool_parser = generic
    if not constraint.params or constraint.tool == "auto":  # a JSON constraint leaves no room to reason
        plan.reasoning = _reasoning(state, body, prompt)
        if plan.reasoning is not None and plan.reasoning.needs_special_tokens:
            overrides["skip_special_tokens"] = False  # the harmony channels are special tokens
    plan.params = sampling_params(body, default_max=max(engine.context_len - len(ids), 1),
                                  extra_stop=tokenizer.chat_stop_strings, top_logprobs=top_logprobs,
                                  constraint=constraint, overrides=overrides)
    check_context(state, len(ids), body)
    plan.retains = chat_request_retains(state, body, ids)
    return plan


# -- the run --------------------------------------------------------------------------------------


async def run_chat(state: ServerState, plan: ChatPlan) -> list[Output]:
    """Run a planned request to completion (its n outputs, by sample index), then retain what it asked."""
    outs = await collect(state.engine, state.metrics, plan.ids, plan.params, rid=plan.rid, cache_salt=plan.cache_salt,
                         lora=plan.lora)
    retain(state.engine, plan.retains, plan.cache_salt, plan.lora)
    return outs


async def stream_chat(state: ServerState, plan: ChatPlan) -> AsyncIterator[Output]:
    """Submit a planned request and stream its outputs. It is submitted before this returns, so bad
    input is a plain 400, not an error inside an event stream; marked prefixes are retained once
    it finished."""
    outputs = run_request(state.engine, state.metrics, plan.ids, plan.params, rid=plan.rid,
                          cache_salt=plan.cache_salt, stream=True, lora=plan.lora)
    stream = PrimedStream(retaining(outputs, state.engine, plan.retains, plan.cache_salt, plan.lora))
    await stream.prime()
    return stream


def _auto_parser(state: ServerState, body: ChatCompletionRequest, specs: list) -> ToolParser:
    name = body.tool_call_parser or state.tool_call_parser[0]
    if body.tool_call_parser is not None and body.tool_call_parser not in ("auto", "none"):
        try:
            parser_class(body.tool_call_parser)
        except ValueError as exc:
            raise bad_request(exc) from exc
    if body.tool_call_parser == "auto":
        name = state.tool_call_parser[0]
    if name is None or name == "none":
        raise APIError(400, "tool_choice: 'auto' needs the model's tool-call format, and none is known for this "
                            f"model ({state.tool_call_parser[1]}); start the server with --tool-call-parser NAME, "
                            "send tool_call_parser, or use tool_choice 'required' or a named function", "tool_choice")
    return parser_class(name)(specs)


def _opened_call(prompt: str, trigger: str) -> str:
    """The call markup at the end of the prompt, when the template opened a call itself."""
    at = prompt.rfind(trigger)
    if at >= 0 and not prompt[at + len(trigger):].strip():
        return prompt[at:]
    return ""


def _special_tokens(engine: object) -> frozenset[str]:
    hf = engine.tokenizer.hf  # type: ignore[attr-defined]
    decoder = getattr(hf, "added_tokens_decoder", {}) or {}
    return frozenset(t.content for t in decoder.values() if getattr(t, "special", False))


def _reasoning(state: ServerState, body: ChatCompletionRequest, prompt: str) -> ReasoningParser | None:
    name = body.reasoning_parser if body.reasoning_parser not in (None, "auto") else state.reasoning_parser[0]
    if name is None or name == "none":
        return None
    try:
        cls = reasoning_class(name)
    except ValueError as exc:
        raise bad_request(exc) from exc
    return cls(prompt_open=prompt.rstrip().endswith(THINK_START))


# -- the answer -----------------------------------------------------------------------------------


def final_message(plan: ChatPlan, out: Output) -> tuple[AssistantMessage, str | None]:
    """The assistant message of a finished output, and its finish_reason ("tool_calls" when it calls)."""
    reasoning, text = None, out.text
    if plan.reasoning is not None:
        split = plan.reasoning.split(text, final=True)
        reasoning, text = split.reasoning or None, split.content
    if plan.tool_parser is None:
        return AssistantMessage(content=text, reasoning_content=reasoning), out.finish_reason
    parsed = plan.tool_parser.parse(plan.tool_prefix + text, final=True)
    calls = [ToolCall(id=new_call_id(), function=ToolCallFunction(c.name, c.arguments)) for c in parsed.calls]
    content = parsed.content
    if calls and not content.strip():
        content = None  # type: ignore[assignment]
    reason = "tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason
    return AssistantMessage(content=content, tool_calls=calls or None, reasoning_content=reasoning), reason


class ChoiceStream:
    """One choice's streamed deltas: reasoning first split off, then calls out of the rest."""

    def __init__(self, plan: ChatPlan) -> None:
        self.reasoning = StreamingReasoning(plan.reasoning) if plan.reasoning is not None else None
        self.tools = StreamingToolParser(plan.tool_parser, plan.tool_prefix) if plan.tool_parser else None
        self.called = False

    def feed(self, delta: str, final: bool = False) -> list[DeltaMessage]:
        deltas: list[DeltaMessage] = []
        content = delta
        if self.reasoning is not None:
            thought, content = self.reasoning.feed(delta, final)
            if thought:
                deltas.append(DeltaMessage(reasoning_content=thought))
        if self.tools is None:
            if content:
                deltas.append(DeltaMessage(content=content))
            return deltas
        events = self.tools.feed(content)
        if final:
            events += self.tools.finish()
        deltas.extend(self._delta(e) for e in events)
        return deltas

    def finish_reason(self, out: Output) -> str | None:
        return "tool_calls" if self.called and out.finish_reason == "stop" else out.finish_reason

    def _delta(self, event: Event) -> DeltaMessage:
        if isinstance(event, ContentDelta):
            return DeltaMessage(content=event.text)
        self.called = True
        if isinstance(event, CallStart):
            return DeltaMessage(tool_calls=[DeltaToolCall(index=event.index, id=event.id, type="function",
                                                          function=DeltaFunction(name=event.name, arguments=""))])
        assert isinstance(event, ArgumentsDelta)
        return DeltaMessage(tool_calls=[DeltaToolCall(index=event.index, function=DeltaFunction(arguments=event.text))])
