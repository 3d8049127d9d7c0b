"""Shared by the examples: `--url` runs against a server (RuntimeEndpoint), else an in-process Engine."""

from __future__ import annotations

import argparse

from frontend_lang import RuntimeEndpoint, set_default_backend


def setup(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="a radixserve server, e.g. http://127.0.0.1:30000 (default: in-process)")
    parser.add_argument("--model", default="default", help="model for the in-process engine")
    args = parser.parse_args()
    if args.url:
        set_default_backend(RuntimeEndpoint(args.url))
    else:
        from runtime import Engine

        set_default_backend(Engine(model=args.model, kv_cache_tokens=16384))
    return args
