"""Decode step time of a model in our runtime vs transformers' own forward, same shapes, one run.

For each batch size B: B requests each with `context` cached tokens take one decode step
(one new token each). Transformers runs the same step with its DynamicCache prefilled to the
same length. Reports milliseconds per step and tokens/s, and the ratio.

    python -m benchmarks.decode_step [--model default] [--batches 1 8 32 128] [--dtypes bfloat16 float32]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from runtime.exec.model_runner import DTYPES, ModelRunner, RunnerConfig
from runtime.loading.sources import resolve_model_path
from runtime.step.forward_batch import BatchEntry, ForwardBatch


def _time(fn, repeats: int) -> float:  # noqa: ANN001
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def ours(path, dtype: str, batch: int, context: int, repeats: int) -> float:  # noqa: ANN001
    runner = ModelRunner(RunnerConfig(path, dtype=dtype, num_slots=batch * (context + 8), max_requests=batch,
                                      max_context=context + 8))
    rows = [runner.table.alloc_row() for _ in range(batch)]
    for i, row in enumerate(rows):
        runner.table.write(row, 0, torch.arange(i * (context + 8), (i + 1) * (context + 8)))
    step = ForwardBatch.build([BatchEntry(row, context, [100]) for row in rows], runner.table)
    return _time(lambda: runner.forward(step), repeats)


@torch.inference_mode()
def theirs(path, dtype: str, batch: int, context: int, repeats: int) -> float:  # noqa: ANN001
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype]).eval()
    ids = torch.randint(10, 1000, (batch, context))
    cache = DynamicCache(config=model.config)
    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)  # full-prompt logits would not fit
    token = torch.full((batch, 1), 100)
    position = torch.full((batch, 1), context)

    def step() -> None:
        model(token, past_key_values=cache, use_cache=True, position_ids=position, logits_to_keep=1)
        cache.crop(-1)  # drop the token just added, so every step sees the same context

    return _time(step, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    path = resolve_model_path(args.model)
    rows = []
    for dtype in args.dtypes:
        for batch in args.batches:
            a = ours(path, dtype, batch, args.context, args.repeats)
            b = theirs(path, dtype, batch, args.context, args.repeats)
            rows.append({"dtype": dtype, "batch": batch, "radixserve_ms": a * 1e3, "transformers_ms": b * 1e3,
                         "radixserve_tok_s": batch / a, "transformers_tok_s": batch / b, "speedup": b / a})
            print(f"{dtype:>9} B={batch:<4} radixserve {a * 1e3:8.1f} ms ({batch / a:7.1f} tok/s)   "
                  f"transformers {b * 1e3:8.1f} ms ({batch / b:7.1f} tok/s)   {b / a:5.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"model": args.model, "context": args.context, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
