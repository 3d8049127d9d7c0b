"""What every handler shares: the engine, metrics, server settings, and body reading with limits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

import msgspec
from starlette.requests import Request

from runtime import Engine
from runtime.loading.builtin_models import builtin_model
from server.common.errors import APIError
from server.common.metrics import Metrics
from server.pooling.rerank import DEFAULT_INSTRUCTION, DEFAULT_TOKENS, QWEN3_RERANKER_TEMPLATE, Reranker

logger = logging.getLogger("radixserve.server")
T = TypeVar("T")
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_requests: bool = False
    log_level: str = "info"
    # Agents (docs/agents.md): the model's tool-call and reasoning formats; auto reads the chat template.
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    # Responses API (server/responses/store.py): how many answers previous_response_id can continue,
    # and for how long (seconds); their conversations stay pinned in the prefix cache as long.
    responses_store_size: int = 1024
    responses_ttl: float = 600.0
    # /v1/rerank and /v1/score (server/pooling/rerank.py): the reranker's prompt and its two judging tokens.
    rerank_template: str = QWEN3_RERANKER_TEMPLATE
    rerank_instruction: str = DEFAULT_INSTRUCTION
    rerank_tokens: str = DEFAULT_TOKENS


@dataclass
class ServerState:
    engine: Engine
    settings: ServerSettings
    engine_args: dict[str, object]
    metrics: Metrics = field(init=False)
    started: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.engine, self.served_model_name)
        self._token_text = lru_cache(maxsize=65536)(self._decode_token)
        self.tool_call_parser, self.reasoning_parser = resolve_parsers(self.engine, self.settings)
        s = self.settings
        self.reranker = Reranker(s.rerank_template, s.rerank_instruction, s.rerank_tokens)

    @property
    def parser_info(self) -> dict[str, object]:
        """What /get_server_info reports: the parsers in use and why."""
        return {"tool_call_parser_resolved": self.tool_call_parser[0], "tool_call_parser_reason": self.tool_call_parser[1],
                "reasoning_parser_resolved": self.reasoning_parser[0], "reasoning_parser_reason": self.reasoning_parser[1]}

    @property
    def served_model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return "gemma-3-270m" if self.engine.args.model == "default" else self.engine.args.model

    @property
    def model_names(self) -> set[str]:
        """Every name a client may ask for this model by: the served name, --model as given, its
        folder, and a built-in's canonical name beside its aliases (Codex asks for the former)."""
        builtin = builtin_model(self.engine.args.model)
        return {self.served_model_name, self.engine.args.model, str(self.engine.model_path),
                *(builtin.names if builtin is not None else ())}

    def check_model(self, model: str | None, adapters: bool = False) -> str | None:
        """A request's `model` must name this one (or be absent): else a 400 naming the field. With
        `adapters` (a route that serves them), it may name a loaded LoRA adapter, as vLLM's does: its
        name is returned (None: the base model)."""
        if model is None or model in self.model_names:
            return None
        if model in self.adapter_names():
            if adapters:
                return model
            raise APIError(400, f"model {model!r} is a LoRA adapter; this route serves the base model "
                                f"{self.served_model_name!r} only", "model")
        names = [self.served_model_name, *self.adapter_names()]
        raise APIError(400, f"model {model!r} is not served here; available: {', '.join(map(repr, names))}", "model")

    def adapter_names(self) -> list[str]:
        lora = self.engine.lora
        return lora.names() if lora is not None else []

    def adapter_for(self, model: str | None, lora_path: object = None) -> str | None:
        """The adapter a request runs through: SGLang's `lora_path` (an adapter's name) where set, else
        `model` where it names one (vLLM); None: the base model. A 400 naming the field otherwise."""
        if lora_path is None or lora_path == "":
            return self.check_model(model, adapters=True)
        self.check_model(model, adapters=True)
        if not isinstance(lora_path, str) or lora_path not in self.adapter_names():
            loaded = ", ".join(map(repr, self.adapter_names())) or "none (start with --enable-lora or --lora-paths)"
            raise APIError(400, f"lora_path: {lora_path!r} is not a loaded LoRA adapter; loaded: {loaded}", "lora_path")
        return lora_path

    def token_text(self, token: int) -> str:
        return self._token_text(token)

    def _decode_token(self, token: int) -> str:
        return self.engine.tokenizer.decode([token], skip_special_tokens=False)

    async def read_body(self, request: Request) -> bytes:
        limit = self.settings.max_request_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body is larger than {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"request body is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def log_request(self, rid: str, prompt: object) -> None:
        # Prompts and outputs are private: logged only when the operator asked for it.
        if self.settings.log_requests:
            logger.info("request %s: %r", rid, prompt)

    def log_response(self, rid: str, texts: list[str]) -> None:
        if self.settings.log_requests:
            logger.info("response %s: %r", rid, texts)


def resolve_parsers(engine: Engine, settings: ServerSettings) -> tuple[tuple[str | None, str], tuple[str | None, str]]:
    """((tool-call parser, why), (reasoning parser, why)) from the flags; auto reads the chat template.
    An unknown name is a ValueError naming the flag."""
    from server.parsers import reasoning as reasoning_parser  # noqa: PLC0415 - server.common.state is imported by both
    from server.parsers import tools as tool_parsers  # noqa: PLC0415

    template = engine.tokenizer.chat_template
    model_type = getattr(engine.model_config, "model_type", "") or ""
    found = []
    builtin = builtin_model(engine.args.model)

    def detect_tool_parser() -> tuple[str | None, str]:
        # A built-in model names the format it really writes (runtime/loading/builtin_models.py), which
        # its chat template may not: Qwen2.5-Coder's template teaches hermes tags it seldom uses.
        if builtin is not None and builtin.tool_call_parser is not None:
            return builtin.tool_call_parser, f"the built-in model {builtin.name} writes this format"
        return tool_parsers.detect(template, model_type)

    for flag, module, detect in (("tool_call_parser", tool_parsers, detect_tool_parser),
                                 ("reasoning_parser", reasoning_parser, lambda: reasoning_parser.detect(template))):
        value = getattr(settings, flag)
        if value == "none":
            found.append((None, f"--{flag.replace('_', '-')} none"))
        elif value == "auto":
            found.append(detect())
        else:
            cls = module.parser_class(value) if flag == "tool_call_parser" else module.reasoning_class(value)
            found.append((cls.name, f"--{flag.replace('_', '-')} {value}"))
        logger.info("%s: %s (%s)", flag, found[-1][0] or "none", found[-1][1])
    return found[0], found[1]


def decode_body(body: bytes, kind: type[T]) -> T:
    if not body.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = message.split("at `$.", 1)[1].rstrip("`") if "at `$." in message else None
        raise APIError(400, f"invalid request: {message}", param) from exc
    except msgspec.DecodeError as exc:
        raise APIError(400, f"malformed JSON: {exc}") from exc
