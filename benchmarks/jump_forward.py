"""Jump-forward decoding (runtime/sampling/jump_forward.py): JSON decoding against a schema with it on and off.

    python -m benchmarks.jump_forward [--model default] [--streams 1 8] [--rounds 2]
        [--narrow-logits-max-tokens N] [--json benchmarks/results/jump-forward.json]

Few-shot prompts ask for one record each as JSON; the output is held to a schema with the keys,
punctuation and enum values a grammar forces (docs/structured-output.md). Greedy, one engine per
setting (jump-forward is an engine argument), rounds alternating off/on so a busy neighbour hurts
both alike; the best round of each is kept. Reported per number of concurrent streams: generated
tokens/s, forward steps (the streams run together, so each request takes part in about all of
them: with one stream, steps per request; tokens per step is what jump-forward raises), the
forced tokens drafted and kept, the logit rows computed only at their grammar's allowed ids
(runtime/exec/step_logits.py; `--narrow-logits-max-tokens 0` computes every row in full), and
whether the outputs are identical (greedy, they must be up to rounding: the draft is verified
under the grammar mask; docs/structured-output.md says when a wider step may round otherwise).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"},
    "country": {"type": "string"},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 2000},
    "continent": {"enum": ["Africa", "Antarctica", "Asia", "Europe", "North America", "Oceania", "South America"]},
    "is_capital": {"type": "boolean"},
    "climate": {"enum": ["tropical", "dry", "temperate", "continental", "polar"]},
}, "required": ["name", "country", "population_millions", "continent", "is_capital", "climate"]}

SHOTS = ('Lima -> {"name": "Lima", "country": "Peru", "population_millions": 10, "continent": "South America", '
         '"is_capital": true, "climate": "dry"}\n'
         'Osaka -> {"name": "Osaka", "country": "Japan", "population_millions": 19, "continent": "Asia", '
         '"is_capital": false, "climate": "temperate"}\n')
CITIES = ["Paris", "Nairobi", "Toronto", "Sydney", "Cairo", "Berlin", "Mumbai", "Denver", "Oslo", "Quito",
          "Hanoi", "Dakar", "Perth", "Lyon", "Accra", "Seoul"]


def prompts(n: int) -> list[str]:
    return [f"City records, one JSON object per line.\n{SHOTS}{CITIES[i % len(CITIES)]} -> " for i in range(n)]


def one_round(engine, streams: int, tokens: int) -> dict:  # noqa: ANN001
    params = {"max_new_tokens": tokens, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    batch = prompts(streams)
    engine.flush_cache()
    engine.generate(batch, sampling_params={"max_new_tokens": 1, "temperature": 0})  # prompts cached: decoding is timed
    before = engine.stats()
    start = time.perf_counter()
    outs = engine.generate(batch, sampling_params=params)
    seconds = time.perf_counter() - start
    after = engine.stats()
    generated = sum(o.completion_tokens for o in outs)
    moved = {key: after.get(key, 0) - before.get(key, 0) for key in
             ("steps_total", "jump_forward_draft_tokens_total", "jump_forward_accepted_tokens_total",
              "narrowed_logit_rows_total")}
    return {"seconds": seconds, "tok_s": generated / seconds, "tokens": generated, "steps": moved["steps_total"],
            "drafted": moved["jump_forward_draft_tokens_total"], "kept": moved["jump_forward_accepted_tokens_total"],
            "narrowed": moved["narrowed_logit_rows_total"],
            "outputs": [o.token_ids for o in outs], "texts": [o.text for o in outs]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--narrow-logits-max-tokens", type=int, default=None,
                        help="the engines' setting (default: theirs); 0 computes every logit row in full")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from benchmarks.peers import cpu_name
    from runtime import Engine

    limit = args.narrow_logits_max_tokens
    narrow = {} if limit is None else {"narrow_logits_max_tokens": limit}
    engines = {on: Engine(model=args.model, device=args.device, kv_cache_tokens=16384,
                          max_running_requests=max(args.streams), disable_jump_forward=not on, **narrow)
               for on in (False, True)}
    rows = []
    try:
        for streams in args.streams:
            best: dict[bool, dict] = {}
            for r in range(args.rounds):
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    result = one_round(engines[on], streams, args.tokens)
                    if on not in best or result["seconds"] < best[on]["seconds"]:
                        best[on] = result
            off, on = best[False], best[True]
            row = {"streams": streams, "off_tok_s": off["tok_s"], "on_tok_s": on["tok_s"],
                   "speedup": on["tok_s"] / off["tok_s"], "off_steps": off["steps"], "on_steps": on["steps"],
                   "tokens": on["tokens"],
                   "forced_drafted": on["drafted"], "forced_kept": on["kept"],
                   "off_narrowed_rows": off["narrowed"], "on_narrowed_rows": on["narrowed"],
                   "identical": on["outputs"] == off["outputs"], "example": on["texts"][0]}
            rows.append(row)
            print(f"{streams:>2} stream(s): off {row['off_tok_s']:6.1f} tok/s in {row['off_steps']} steps; "
                  f"on {row['on_tok_s']:6.1f} tok/s in {row['on_steps']} steps "
                  f"({row['speedup']:.2f}x); forced tokens kept {row['forced_kept']}/{row['forced_drafted']}; "
                  f"rows at allowed ids off/on {row['off_narrowed_rows']}/{row['on_narrowed_rows']}; "
                  f"identical: {row['identical']}", flush=True)
        print("example:", rows[0]["example"])
        device = str(engines[True].device)
        narrow_max = engines[True].args.narrow_logits_max_tokens
    finally:
        for engine in engines.values():
            engine.shutdown()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "device": device, "cpu": cpu_name(),
                                         "date": time.strftime("%Y-%m-%d"), "tokens": args.tokens,
                                         "narrow_logits_max_tokens": narrow_max, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
