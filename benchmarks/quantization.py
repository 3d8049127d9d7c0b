"""Weight quantization on the CPU: how close each way of serving the default model stays to its
exact weights, and how fast one stream runs.

    python -m benchmarks.quantization [--model default] [--tokens 32] [--ways ...] [--json out.json]

The default model is a GGUF (Q4_K_M: Q8_0, Q5_0, Q6_K and Q4_K tensors), so its exact weights are
the dequantized ones in float32; the reference is that model in fp32. Compared with it: bf16
(those weights rounded to bf16, `--quantization none`), gguf (the shipped codes times the bf16
activations: the default where the CPU has the kernels), gguf --int8-activations (its Q4_K layers
over activations rounded to int8, as llama.cpp's), and int8 / int4 (quantized again here).
Quality: greedy continuations of a fixed set of prompts (few-shot facts, lists, code, prose),
one prompt at a time (the quantized kernels serve products of few rows); printed are the share
of prompts whose whole continuation is identical to the reference's and the mean share of tokens
generated before the first difference. Those two are what a user sees, but with 16 prompts one
near-tie flipped is 6 points; so also the teacher-forced agreement: along the reference's own
continuations, the share of the 16 x 32 next tokens each way picks the same (each position a
one-row step over the cached prefix, as in decoding). Speed: one stream, 128 new tokens, best of
three.
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


WAYS = {  # name: (--dtype, --quantization, engine flags)
    "fp32 (exact weights)": ("float32", "none", {}),
    "bf16": ("bfloat16", "none", {}),
    "gguf (default)": ("bfloat16", "gguf", {}),
    "gguf --int8-activations": ("bfloat16", "gguf", {"int8_activations": True}),
    "int8": ("bfloat16", "int8", {}),
    "int4": ("bfloat16", "int4", {}),
    # fp32 activations (what `auto` picks on CPUs without fast bf16): on AVX2 without AVX-512 the
    # codes' products round them to int16 a group at a time unless --exact-activations (docs/cpu.md)
    "gguf fp32": ("float32", "gguf", {}),
    "gguf fp32 --exact-activations": ("float32", "gguf", {"exact_activations": True}),
    "gguf fp32 --int8-activations": ("float32", "gguf", {"int8_activations": True}),
}


GREEDY_ONE = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}


def continuations(model: str, dtype: str, quantization: str, flags: dict[str, bool], tokens: int,
                  reference: list[list[int]]) -> tuple[list[list[int]], float, float]:
    """This way's greedy continuations, its one-stream speed, and its teacher-forced agreement
    with the `reference` continuations (none yet: this way is the reference, agreement 1.0)."""
    from runtime import Engine

    with Engine(model=model, dtype=dtype, quantization=quantization, **flags) as engine:
        # one prompt at a time: the quantized kernels serve products of few rows (one stream)
        outs = [engine.generate(p, sampling_params={"max_new_tokens": tokens, "temperature": 0,
                                                    "ignore_eos": True})[0].token_ids for p in PROMPTS]
        forced = same = 0
        for prompt, want in zip(PROMPTS, reference or outs):
            ids = engine.encode(prompt)
            for i, token in enumerate(want):  # the prefix is cached: one new row a step
                picked = engine.generate(input_ids=ids + list(want[:i]), sampling_params=GREEDY_ONE)[0].token_ids
                forced, same = forced + 1, same + (picked == [token])
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            engine.generate(PROMPTS[0], sampling_params={"max_new_tokens": 128, "temperature": 0, "ignore_eos": True})
            best = min(best, time.perf_counter() - start)
    return outs, 128 / best, same / forced


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
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS),
                        help="which ways to run (the first is the reference)")
    args = parser.parse_args(argv)
    result: dict[str, dict[str, float]] = {}
    reference: list[list[int]] = []
    for name in args.ways:
        dtype, quantization, flags = WAYS[name]
        outs, speed, forced = continuations(args.model, dtype, quantization, flags, args.tokens, reference)
        reference = reference or outs
        result[name] = {"one_stream_tok_s": speed, **agreement(reference, outs), "teacher_forced_share": forced}
    for name, row in result.items():
        print(f"{name:22s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
