"""Weight-only quantization on the CPU: how close int8 and int4 stay to bf16, and how fast one stream runs.

    python -m benchmarks.quantization [--model default] [--tokens 32] [--json out.json]

Quality: greedy continuations of a fixed set of prompts (few-shot facts, lists, code, prose),
one prompt at a time (the quantized kernels serve products of few rows), with bf16 weights and
with each quantization; printed are the share of prompts whose whole
continuation is identical to bf16's and the mean share of tokens generated before the first
difference. Speed: one stream, 128 new tokens, best of three.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PROMPTS = [
    "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:",
    "Q: What is the capital of Japan?\nA: Tokyo\nQ: What is the capital of Italy?\nA:",
    "The planets of the solar system, in order from the sun, are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The French Revolution began in 1789 when",
    "Ingredients for a simple pancake batter:\n-",
    "To install a Python package, you usually run",
    "1, 2, 3, 5, 8, 13,",
    "The chemical symbol for gold is",
    "Once upon a time, in a small village by the sea,",
    "SELECT name, email FROM users WHERE",
    "The three primary colors are",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny =",
    "Photosynthesis is the process by which",
    "Monday, Tuesday, Wednesday,",
    "The tallest mountain on Earth is",
]


def continuations(model: str, quantization: str | None, tokens: int) -> tuple[list[list[int]], float]:
    from runtime import Engine

    with Engine(model=model, dtype="bfloat16", quantization=quantization) as engine:
        # one prompt at a time: the quantized kernels serve products of few rows (one stream)
        outs = [engine.generate(p, sampling_params={"max_new_tokens": tokens, "temperature": 0,
                                                    "ignore_eos": True})[0].token_ids for p in PROMPTS]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            engine.generate(PROMPTS[0], sampling_params={"max_new_tokens": 128, "temperature": 0, "ignore_eos": True})
            best = min(best, time.perf_counter() - start)
    return outs, 128 / best


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    same = sum(a == b for a, b in zip(reference, other))
    prefix = []
    for a, b in zip(reference, other):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(len(a), 1))
    return {"identical_share": same / len(reference), "mean_prefix_share": sum(prefix) / len(prefix)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    reference, speed = continuations(args.model, None, args.tokens)
    result = {"bf16": {"one_stream_tok_s": speed}}
    for q in ("int8", "int4"):
        outs, speed = continuations(args.model, q, args.tokens)
        result[q] = {"one_stream_tok_s": speed, **agreement(reference, outs)}
    for name, row in result.items():
        print(f"{name:5s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
