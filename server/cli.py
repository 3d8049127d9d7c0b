"""`python -m server` / `radixserve`: the command line, generated from EngineArgs plus server flags."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import types
import typing

from runtime.engine_args import EngineArgs
from server.common.state import DEFAULT_MAX_BODY_BYTES, ServerSettings
from server.pooling.rerank import DEFAULT_INSTRUCTION, DEFAULT_TOKENS, QWEN3_RERANKER_TEMPLATE

# Flags named as SGLang and vLLM users expect, where our field name differs.
RENAMED = {"enable_prefix_cache": "--disable-radix-cache"}
ALIASES = {"enable_prefix_cache": ["--no-enable-prefix-caching"], "kv_cache_tokens": ["--max-total-tokens"],
           "context_length": ["--max-model-len"], "num_threads": ["--cpu-threads"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description="radixserve: a prefix-caching LLM server "
                                     "with an OpenAI-compatible API.")
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        help_text = f.metadata.get("help", "")
        kind = hints[f.name]
        if f.name in RENAMED:
            parser.add_argument(RENAMED[f.name], *ALIASES.get(f.name, []), dest=f.name, action="store_false",
                                default=f.default, help=f"turn off: {help_text}")
            continue
        flags = [f"--{f.name.replace('_', '-')}", *ALIASES.get(f.name, [])]
        if kind is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
            continue
        args = typing.get_args(kind)
        base = next((a for a in args if a is not type(None)), kind) if isinstance(kind, types.UnionType) else kind
        if typing.get_origin(base) is list:  # several values after one flag (--lora-paths a=x b=y)
            parser.add_argument(*flags, dest=f.name, nargs="+", type=typing.get_args(base)[0], default=f.default,
                                help=f"{help_text} (default: {f.default})")
            continue
        parser.add_argument(*flags, dest=f.name, type=base, default=f.default,
                            help=f"{help_text} (default: {f.default})")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    server.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on every route but /health")
    server.add_argument("--served-model-name", default=None, help="model name the API reports and accepts")
    server.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"larger bodies get 413 (default: {DEFAULT_MAX_BODY_BYTES})")
    server.add_argument("--log-requests", action="store_true", help="log prompts and outputs (off: they are private)")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    server.add_argument("--tool-call-parser", default="auto", metavar="NAME",
                        help="the model's tool-call format (hermes, llama3, mistral, pythonic, gemma, gpt_oss, or vLLM/SGLang's "
                             "names for them); auto: read from the chat template; none: no tool_choice auto (default: auto)")
    server.add_argument("--reasoning-parser", default="auto", metavar="NAME",
                        help="split <think> reasoning into reasoning_content (qwen3, deepseek_r1; gpt_oss: harmony's "
                             "analysis channel); auto: from the "
                             "chat template; none: leave it in content (default: auto)")
    server.add_argument("--responses-store-size", type=int, default=1024, metavar="N",
                        help="stored /v1/responses answers that previous_response_id can continue (least recently "
                             "used dropped first; default: 1024)")
    server.add_argument("--responses-ttl", type=float, default=600.0, metavar="SECONDS",
                        help="how long a stored response, and its conversation pinned in the prefix cache, is kept "
                             "(default: 600)")
    server.add_argument("--rerank-template", default=QWEN3_RERANKER_TEMPLATE, metavar="TEXT",
                        help="the reranker's prompt for /v1/rerank and /v1/score, with {instruction}, {query} and "
                             "{document} (default: Qwen3-Reranker's)")
    server.add_argument("--rerank-instruction", default=DEFAULT_INSTRUCTION, metavar="TEXT",
                        help="the task line a rerank request does not give itself (default: Qwen3-Reranker's)")
    server.add_argument("--rerank-tokens", default=DEFAULT_TOKENS, metavar="YES,NO",
                        help="the two next tokens a reranker judges by, the relevant one first (default: yes,no)")
    return parser


def parse(argv: list[str] | None = None) -> tuple[EngineArgs, ServerSettings]:
    ns = vars(build_parser().parse_args(argv))
    engine_args = EngineArgs(**{k: ns.pop(k) for k in EngineArgs.field_names()})
    settings = ServerSettings(**ns)
    return engine_args, settings


def check_parser_flags(settings: ServerSettings) -> None:
    """An unknown --tool-call-parser / --reasoning-parser stops startup before the model loads."""
    from server.parsers.reasoning import reasoning_class
    from server.parsers.tools import parser_class

    if settings.tool_call_parser not in ("auto", "none"):
        parser_class(settings.tool_call_parser)
    if settings.reasoning_parser not in ("auto", "none"):
        reasoning_class(settings.reasoning_parser)


def main(argv: list[str] | None = None) -> None:
    engine_args, settings = parse(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine_args.validate()
        check_parser_flags(settings)
    except ValueError as exc:
        print(f"radixserve: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    import uvicorn

    from runtime import Engine
    from server.app import build_app

    engine = Engine(engine_args)
    app = build_app(engine, settings, dataclasses.asdict(engine_args))
    print(f"radixserve: serving {app.state.radix.served_model_name} at http://{settings.host}:{settings.port}/v1",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=10)


if __name__ == "__main__":
    main()
