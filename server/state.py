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
from server.errors import APIError
from server.metrics import Metrics

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


@dataclass
class ServerState:
    engine: Engine
    settings: ServerSettings
    engine_args: dict[str, object]
    metrics: Metrics = field(init=False)
    started: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.engine)
        self._token_text = lru_cache(maxsize=65536)(self._decode_token)

    @property
    def served_model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return "gemma-3-270m" if self.engine.args.model == "default" else self.engine.args.model

    @property
    def model_names(self) -> set[str]:
        return {self.served_model_name, self.engine.args.model, str(self.engine.model_path)}

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
