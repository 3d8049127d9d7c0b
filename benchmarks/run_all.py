"""`make bench`: run the workloads side by side, write JSON and plots, and update the results table of the docs.

Every number in docs/benchmarks.md's results table is written here from the JSON this run produced.

    python -m benchmarks.run_all --quick
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import plots
from benchmarks.offline import RadixSystem, benchmark, run_workload
from benchmarks.workloads import make_workload

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
QUICK_WORKLOADS = ["shared-prefix", "rag", "multi-turn", "few-shot", "tree-of-thought", "no-share"]


def hit_rate_sweep(model: str, sizes: list[int]) -> list[dict]:
    points = []
    for size in sizes:
        system = RadixSystem("radixserve", model, kv_cache_tokens=size)
        try:
            report = run_workload(system, make_workload("shared-prefix", "small"))
        finally:
            system.close()
        points.append({"kv_cache_tokens": size, "cache_hit_rate": report.cache_hit_rate,
                       "output_tokens_per_s": report.output_tokens / report.seconds})
        print(f"kv {size:>6}: hit rate {report.cache_hit_rate:.0%}", flush=True)
    return points


def ttft_samples(model: str) -> dict[str, list[float]]:
    samples = {}
    for name, kwargs in [("radixserve", {}), ("radixserve-nocache", {"enable_prefix_cache": False})]:
        system = RadixSystem(name, model, **kwargs)
        try:
            samples[name] = run_workload(system, make_workload("shared-prefix", "small")).ttfts
        finally:
            system.close()
    return samples


def table(results: list[dict]) -> str:
    lines = ["| workload | system | req/s | prompt tok/s | output tok/s | cache hit | TTFT p50 (s) | radixserve is faster by |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        # Same requests for every system, so requests/s is the fair ratio (select workloads output no tokens).
        base = r["systems"][0]["requests_per_s"]
        for s in r["systems"]:
            hit = "-" if s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.0%}"
            ttft = "-" if s["ttft_p50_s"] is None else f"{s['ttft_p50_s']:.2f}"
            speed = f"{base / s['requests_per_s']:.2f}x" if s["requests_per_s"] else "-"
            lines.append(f"| {r['workload']} | {s['name']} | {s['requests_per_s']:.2f} | "
                         f"{s['input_tokens_per_s']:.0f} | {s['output_tokens_per_s']:.1f} | {hit} | {ttft} | {speed} |")
    return "\n".join(lines)


def update_results_page(results: list[dict], stamp: str) -> None:
    text = RESULTS_PAGE.read_text()
    body = (f"{BEGIN}\nMeasured by `make bench` on {stamp}, default model, small scale, one run on this machine "
            f"(ratios matter; absolute numbers move with the machine's load). Plots: `benchmarks/results/`.\n\n"
            f"{table(results)}\n{END}")
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), body, text, flags=re.S)
    else:
        text += "\n## Benchmark results\n\n" + body + "\n"
    RESULTS_PAGE.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small scale; transformers-naive only on one workload")
    parser.add_argument("--model", default="default")
    parser.add_argument("--workloads", nargs="+", default=QUICK_WORKLOADS)
    parser.add_argument("--no-write", "--no-readme", dest="no_write", action="store_true",
                        help="leave docs/benchmarks.md as it is (--no-readme: the old name)")
    parser.add_argument("--from-results", action="store_true",
                        help="rebuild plots and the docs' results table from the JSON files of the last run")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        results = [json.loads((RESULTS / f"offline-{name}.json").read_text()) for name in args.workloads]
        plots.throughput_by_workload(results, RESULTS / "throughput.png")
        plots.ttft_by_system(results, RESULTS / "ttft-by-system.png")
        stamp = time.strftime("%Y-%m-%d", time.localtime((RESULTS / f"offline-{args.workloads[0]}.json").stat().st_mtime))
        update_results_page(results, stamp)
        print(table(results))
        return
    results = []
    for i, name in enumerate(args.workloads):
        print(f"== {name}", flush=True)
        skip = ("transformers-naive",) if args.quick and i > 0 else ()
        result = benchmark(name, args.model, "small", compare=True, skip=skip)
        (RESULTS / f"offline-{name}.json").write_text(json.dumps(result, indent=2))
        results.append(result)
    print("== hit rate vs KV cache size", flush=True)
    sweep = hit_rate_sweep(args.model, [1024, 2048, 4096, 8192, 16384])
    (RESULTS / "hit-rate-vs-kv.json").write_text(json.dumps(sweep, indent=2))
    samples = ttft_samples(args.model)
    (RESULTS / "ttft-samples.json").write_text(json.dumps(samples, indent=2))
    plots.throughput_by_workload(results, RESULTS / "throughput.png")
    plots.ttft_by_system(results, RESULTS / "ttft-by-system.png")
    plots.ttft_cdf(samples, RESULTS / "ttft-cdf.png")
    plots.hit_rate_vs_kv(sweep, RESULTS / "hit-rate-vs-kv.png")
    if not args.no_write:
        update_results_page(results, time.strftime("%Y-%m-%d"))
    print(table(results))


if __name__ == "__main__":
    main()
