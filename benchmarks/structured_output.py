"""What constrained decoding costs: decode tokens/s with and without a JSON-schema constraint.

For each batch size, the same prompts are decoded twice on one engine: free (ignore_eos, a fixed
number of tokens) and under a JSON schema whose array of integers can run as long as the free
text. Reported: generated tokens/s for each, and the share of the constrained run spent filling
and applying the grammar's token masks (timed around the engine's mask call, on the host).

    python -m benchmarks.structured_output [--model default] [--device cpu|cuda] [--batches 1 64]
        [--tokens 32] [--json benchmarks/results/structured-output.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "integer"}}},
          "required": ["values"]}


def run(engine, batch: int, tokens: int) -> dict:  # noqa: ANN001
    prompts = [f"Record {i}: a list of measurements as JSON.\n" for i in range(batch)]
    free = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    constrained = {"max_new_tokens": tokens, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    engine.generate(prompts[:1], sampling_params=constrained)  # compile (cached) and warm up
    engine.flush_cache()
    row = {"batch": batch}
    for name, params in (("free", free), ("json_schema", constrained)):
        engine.flush_cache()
        with engine.time_steps() as timings:  # its "mask" phase is the grammar bitmasks' host time
            start = time.perf_counter()
            outs = engine.generate(prompts, sampling_params=params)
            seconds = time.perf_counter() - start
        spent = [timings.host_s["mask"]]
        generated = sum(o.completion_tokens for o in outs)
        row[f"{name}_tokens_per_s"] = generated / seconds
        row[f"{name}_tokens"] = generated
        if name == "json_schema":
            row["mask_share"] = spent[0] / seconds
            row["mask_ms_per_token"] = 1e3 * spent[0] / max(generated / batch, 1)
    row["slowdown"] = row["free_tokens_per_s"] / row["json_schema_tokens_per_s"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from runtime import Engine

    rows = []
    with Engine(model=args.model, device=args.device, load_format=args.load_format, kv_cache_tokens=32768,
                max_running_requests=max(args.batches)) as engine:
        for batch in args.batches:
            row = run(engine, batch, args.tokens)
            rows.append(row)
            print(f"batch {batch:>3}: free {row['free_tokens_per_s']:8.1f} tok/s, json_schema "
                  f"{row['json_schema_tokens_per_s']:8.1f} tok/s ({row['slowdown']:.2f}x slower); masks "
                  f"{100 * row['mask_share']:.1f}% of the constrained run", flush=True)
        device = str(engine.device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
