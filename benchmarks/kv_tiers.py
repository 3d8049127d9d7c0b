"""The prefix cache's host and disk tiers, measured (docs/cache.md, "Host and disk tiers").

    python -m benchmarks.kv_tiers [--model default] [--json out.json]

Three figures, each with the tiers on and off, one engine at a time, on this machine:
- restart: a ~2,000-token document prompt (one token out), the engine shut down and built
  again on the same --kv-disk-dir, the same prompt sent again: time to first token, cold vs
  after the restart;
- RAG over documents that need 4x the KV pool: a stream of questions, each about one of the
  documents at random; hit rate (cached / prompt tokens) and requests/s with the pool alone,
  with a host tier, and with a pool big enough for everything (the hit rate to approach);
- no sharing: distinct prompts, to see what the tiers cost when nothing hits.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

WORDS = ("river garden music market letter answer energy island history science ocean forest village "
         "station morning winter summer language window mountain").split()


def document(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def restart(model: str, doc_words: int) -> dict:
    from runtime import Engine

    prompt = "Document:\n" + document(random.Random(1), doc_words) + "\nQuestion: what is it about?\nAnswer:"
    params = {"max_new_tokens": 1, "temperature": 0}
    warm_up = "A short unrelated prompt to warm the engine up."  # first-call costs, not the KV's
    with tempfile.TemporaryDirectory() as folder:
        with Engine(model=model, kv_disk_dir=folder) as first:
            first.generate(warm_up, sampling_params=params)
            start = time.perf_counter()
            (cold,) = first.generate(prompt, sampling_params=params)
            cold_s = time.perf_counter() - start
        with Engine(model=model, kv_disk_dir=folder) as second:
            second.generate(warm_up, sampling_params=params)
            start = time.perf_counter()
            (warm,) = second.generate(prompt, sampling_params=params)
            warm_s = time.perf_counter() - start
    return {"prompt_tokens": cold.prompt_tokens, "cold_ttft_s": cold_s, "restarted_ttft_s": warm_s,
            "restarted_cached_tokens": warm.cached_tokens, "ratio": warm_s / cold_s}


def rag(model: str, docs: int, doc_words: int, questions: int, pool_tokens: int, **engine_args: object) -> dict:
    from runtime import Engine

    rng = random.Random(2)
    texts = [document(rng, doc_words) for _ in range(docs)]
    asks = [(rng.randrange(docs), document(rng, 8)) for _ in range(questions)]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model=model, kv_cache_tokens=pool_tokens, **engine_args) as engine:
        start = time.perf_counter()
        for doc, question in asks:
            engine.generate(f"Document:\n{texts[doc]}\nQuestion: {question}\nAnswer:", sampling_params=params)
        seconds = time.perf_counter() - start
        stats = engine.stats()
    return {"req_per_s": questions / seconds, "hit_rate": stats["cache_hit_rate"], "seconds": seconds,
            "promoted_host_tokens": stats.get("tier_promoted_host_tokens_total", 0)}


def no_share(model: str, prompts: int, words: int, **engine_args: object) -> dict:
    from runtime import Engine

    rng = random.Random(3)
    texts = [document(rng, words) for _ in range(prompts)]
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    with Engine(model=model, **engine_args) as engine:
        engine.generate(texts[0], sampling_params=params)  # warm-up
        start = time.perf_counter()
        for text in texts[1:]:
            engine.generate(text, sampling_params=params)
        seconds = time.perf_counter() - start
    return {"req_per_s": (prompts - 1) / seconds, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--doc-words", type=int, default=1000, help="~2 tokens a word with the default model")
    parser.add_argument("--restart-doc-words", type=int, default=2000, help="the restart figure's document")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out: dict = {"restart": restart(args.model, args.restart_doc_words)}
    print("restart:", json.dumps(out["restart"]), flush=True)
    doc_tokens = out["restart"]["prompt_tokens"] * args.doc_words // args.restart_doc_words
    pool = max(doc_tokens * args.docs // 4, doc_tokens + 64)  # the documents need 4x the pool
    with tempfile.TemporaryDirectory() as folder:
        runs = {"pool alone": {}, "host tier": {"kv_host_tier_tokens": 8 * pool},
                "host + disk tiers": {"kv_host_tier_tokens": 8 * pool, "kv_disk_dir": folder}}
        out["rag"] = {"pool_tokens": pool, "document_tokens": doc_tokens}
        for name, extra in runs.items():
            out["rag"][name] = rag(args.model, args.docs, args.doc_words, args.questions, pool, **extra)
            print(f"rag, {name}:", json.dumps(out["rag"][name]), flush=True)
        out["rag"]["unbounded pool"] = rag(args.model, args.docs, args.doc_words, args.questions, 16 * pool)
        print("rag, unbounded pool:", json.dumps(out["rag"]["unbounded pool"]), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        out["no_share"] = {name: no_share(args.model, 12, max(args.doc_words // 4, 2), **extra) for name, extra in
                           {"tiers off": {}, "host tier": {"kv_host_tier_tokens": 65536},
                            "host + disk tiers": {"kv_host_tier_tokens": 65536, "kv_disk_dir": folder}}.items()}
    print("no share:", json.dumps(out["no_share"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
