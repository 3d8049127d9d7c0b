"""The four headline numbers on the default model, measured side by side in one run:

- prompt processing: tokens/s prefilling a 512-token prompt with nothing cached;
- 16 concurrent streams: generated tokens/s in all;
- cached TTFT: time to first token of a re-sent prompt whose 500-token prefix is cached;
- one stream: generated tokens/s of a single request.

    python -m benchmarks.targets [--dtype auto] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from runtime import Engine

TARGETS = {"prompt_tok_s": 1300, "streams16_tok_s": 330, "cached_ttft_s": 0.10, "one_stream_tok_s": 24}
PEERS_VLLM = {"prompt_tok_s": 1289, "streams16_tok_s": 275, "cached_ttft_s": 0.13, "one_stream_tok_s": 24}


def measure(engine: Engine, repeats: int = 3) -> dict[str, float]:
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees".split()

    def prompt(n: int) -> list[int]:
        ids = engine.tokenizer.encode(" ".join(rng.choice(words) for _ in range(n)))
        return ids[:n]

    greedy = {"temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=prompt(64), sampling_params={**greedy, "max_new_tokens": 4})  # warm up
    best_prefill = 0.0
    for _ in range(repeats):
        ids = prompt(512)
        start = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={**greedy, "max_new_tokens": 1})
        best_prefill = max(best_prefill, len(ids) / (time.perf_counter() - start))
    shared = prompt(500)
    engine.generate(input_ids=shared + [7], sampling_params={**greedy, "max_new_tokens": 1})
    ttfts = []
    for i in range(repeats):
        start = time.perf_counter()
        out = engine.generate(input_ids=shared + [11 + i, 12], sampling_params={**greedy, "max_new_tokens": 1})[0]
        ttfts.append(time.perf_counter() - start)
        assert out.cached_tokens >= 500
    start = time.perf_counter()
    engine.generate(input_ids=prompt(32), sampling_params={**greedy, "max_new_tokens": 64})
    one = 64 / (time.perf_counter() - start)
    prompts = [prompt(32) for _ in range(16)]
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params={**greedy, "max_new_tokens": 64})
    many = 16 * 64 / (time.perf_counter() - start)
    return {"prompt_tok_s": best_prefill, "streams16_tok_s": many, "cached_ttft_s": min(ttfts), "one_stream_tok_s": one}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    with Engine(model=args.model, dtype=args.dtype, kv_cache_tokens=32768) as engine:
        got = measure(engine)
    for key, value in got.items():
        print(f"{key:>18}: {value:9.3f}   target {TARGETS[key]:>7}   vLLM CPU (reported) {PEERS_VLLM[key]:>7}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"model": args.model, "dtype": args.dtype, "measured": got, "targets": TARGETS}, handle, indent=2)


if __name__ == "__main__":
    main()
