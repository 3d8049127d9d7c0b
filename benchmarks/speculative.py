"""Prompt-lookup speculative decoding on RAG-shaped one-stream work (docs/cpu.md, "Speculative decoding").

    python -m benchmarks.speculative [--model default] [--temperature T] [--json out.json]

A ~1,500-token document, then a request whose answer quotes it (128 new tokens, greedy; with
--temperature > 0, sampled with a fixed seed), one stream, speculation off and on (best of 3
each, the document cached in both, so what is timed is decoding). Printed: tokens/s each way, the
speed-up, the draft acceptance rate, and whether the two outputs are identical (they must be:
greedy, and seeded sampling under rejection sampling, give the same tokens either way).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

SENTENCES = [
    "The river delta was settled by farmers who grew rice in the flooded fields each spring.",
    "Merchants from the coast brought salt, iron tools and dyed cloth up the river on flat boats.",
    "Every autumn the village council met in the long house to settle disputes over water rights.",
    "The old stone bridge, built without mortar, has survived three great floods since it was raised.",
    "Children learned to read from the temple priests, who kept the only books in the valley.",
    "A new road over the mountain pass cut the journey to the capital from nine days to four.",
]


def document(words_target: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while sum(len(s.split()) for s in out) < words_target:
        out.append(rng.choice(SENTENCES))
    return " ".join(out)


def rag_prompt(doc_words: int = 1100, seed: int = 0) -> str:
    """A document (~1,500 tokens at 1,100 words) and a question whose answer quotes it."""
    doc = document(doc_words, seed)
    return f"Document:\n{doc}\n\nQuestion: Repeat the document's first sentences word for word.\nAnswer: {doc[:60]}"


def run(model: str, speculative: bool, prompt: str, tokens: int, temperature: float = 0.0) -> dict:
    from runtime import Engine

    extra = {"speculative_algorithm": "ngram"} if speculative else {}
    params = {"max_new_tokens": tokens, "temperature": temperature, "ignore_eos": True, "seed": 0}
    with Engine(model=model, **extra) as engine:
        engine.generate(prompt, sampling_params={**params, "max_new_tokens": 1})  # the document is cached
        best, text = float("inf"), ""
        for _ in range(3):
            start = time.perf_counter()
            (out,) = engine.generate(prompt, sampling_params=params)
            best = min(best, time.perf_counter() - start)
            text = out.text
        stats = engine.stats()
    return {"tok_s": tokens / best, "text": text, "acceptance": stats.get("spec_acceptance_rate")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--doc-words", type=int, default=1100)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: seeded sampling")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    prompt = rag_prompt(args.doc_words)
    off = run(args.model, False, prompt, args.tokens, args.temperature)
    on = run(args.model, True, prompt, args.tokens, args.temperature)
    result = {"temperature": args.temperature, "off_tok_s": off["tok_s"], "on_tok_s": on["tok_s"],
              "speedup": on["tok_s"] / off["tok_s"],
              "acceptance_rate": on["acceptance"], "identical": on["text"] == off["text"]}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
