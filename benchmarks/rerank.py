"""Rerank with the radix cache and without: one query against N documents (docs/apis.md, "Embeddings,
rerank and score").

    python -m benchmarks.rerank [--model default] [--documents 50] [--rounds 3] [--json out.json]

Each document is one prompt of the reranker's template (Qwen3-Reranker's, server/pooling/rerank.py):
its instruction and the query first, the document last, so every prompt of a request starts with
the same ~300 tokens. The engine scores all N at once (as /v1/rerank submits them), with the
prefix cache on and off, best of `rounds` each (the cache flushed before every round, so the
shared prefix is computed once per round, not carried over). Printed: seconds per rerank, the
prompt tokens computed, and the speed-up; the scores must be the same either way.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.speculative import document
from server.pooling.rerank import Reranker, relevance

QUERY = ("Which passages describe how the villagers governed themselves and settled disputes over land, water "
         "and trade, and how their laws changed after the new mountain road brought merchants and officials "
         "from the capital? Prefer passages that name the council, the priests or the bridge.")
INSTRUCTION = ("Given a long question from a historian about the governance and trade of a river village, judge "
               "whether the passage helps to answer it, considering the council, the temple, the bridge, the road "
               "and the merchants; a passage about farming alone does not.")


def run(model: str, documents: int, rounds: int, cache: bool) -> dict[str, object]:
    from runtime import Engine

    reranker = Reranker(instruction=INSTRUCTION)
    docs = [document(60, seed=i) for i in range(documents)]
    with Engine(model=model, enable_prefix_cache=cache) as engine:
        token_ids = reranker.token_ids(engine.tokenizer)
        prompts = [reranker.prompt(QUERY, d) for d in docs]
        engine.score_next_tokens(prompts[:1], token_ids=token_ids)  # warm-up
        best, computed, scores = float("inf"), 0, []
        for _ in range(rounds):
            engine.flush_cache()
            before = engine.stats()["computed_prompt_tokens_total"]
            start = time.perf_counter()
            outs = engine.score_next_tokens(prompts, token_ids=token_ids)
            best = min(best, time.perf_counter() - start)
            computed = int(engine.stats()["computed_prompt_tokens_total"] - before)
            scores = [relevance(o.token_logits or []) for o in outs]
        total = sum(o.prompt_tokens for o in outs)
    return {"cache": cache, "seconds": best, "prompt_tokens": total, "computed_tokens": computed, "scores": scores}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "rerank.json"))
    args = parser.parse_args(argv)
    on, off = (run(args.model, args.documents, args.rounds, cache) for cache in (True, False))
    drift = max(abs(a - b) for a, b in zip(on["scores"], off["scores"]))  # type: ignore[arg-type]
    report = {"model": args.model, "documents": args.documents, "date": time.strftime("%Y-%m-%d"),
              "cache_on": on, "cache_off": off, "speedup": off["seconds"] / on["seconds"],  # type: ignore[operator]
              "max_score_difference": drift}
    for r in (on, off):
        print(f"cache {'on ' if r['cache'] else 'off'}: {r['seconds']:.2f} s for {args.documents} documents, "
              f"{r['computed_tokens']:,} of {r['prompt_tokens']:,} prompt tokens computed")
    print(f"speed-up {report['speedup']:.2f}x; largest score difference {drift:.2e}")
    Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
