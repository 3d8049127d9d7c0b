"""Offline throughput: run a workload through the Engine (and, with --compare, its variants and
transformers) in one process and one run, and report ratios.

    python -m benchmarks.offline --workload shared-prefix --scale small --compare --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.systems import RadixSystem, Result, System, TransformersSystem
from benchmarks.workloads import SCALES, WORKLOADS, Workload, make_workload
from runtime.exec.device import DTYPES


@dataclass
class Report:
    name: str
    requests: int
    seconds: float
    input_tokens: int
    output_tokens: int
    cache_hit_rate: float | None
    ttfts: list[float]
    tpots: list[float]

    def row(self) -> dict[str, object]:
        return {
            "name": self.name,
            "requests_per_s": self.requests / self.seconds,
            "input_tokens_per_s": self.input_tokens / self.seconds,
            "output_tokens_per_s": self.output_tokens / self.seconds,
            "cache_hit_rate": self.cache_hit_rate,
            "ttft_p50_s": _pct(self.ttfts, 50),
            "ttft_p90_s": _pct(self.ttfts, 90),
            "tpot_p50_s": _pct(self.tpots, 50),
            "tpot_p90_s": _pct(self.tpots, 90),
            "seconds": self.seconds,
        }


def _pct(values: list[float], p: int) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run_workload(system: System, workload: Workload) -> Report:
    history: list[list[str]] = []
    results: list[Result] = []
    start = time.perf_counter()
    for build in workload.phases:
        phase = system.run_phase(build(history))
        history.append([r.text for r in phase])
        results.extend(phase)
    seconds = time.perf_counter() - start
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in results if r.output_tokens > 1]
    return Report(system.name, len(results), seconds, sum(r.prompt_tokens for r in results),
                  sum(r.output_tokens for r in results), system.cache_hit_rate(), [r.ttft_s for r in results], tpots)


def transformers_dtype(name: str = "auto") -> torch.dtype:
    """The transformers baselines' dtype: `auto` is this machine's best for them, by the same
    measurement as our `--dtype auto` (bf16 where bf16 matrix work keeps up with fp32, i.e. CPUs
    with bf16 units; else fp32), so the baseline is not handicapped by a dtype choice."""
    from runtime.cpu.precision import resolve_precision

    return resolve_precision(name, torch.device("cpu")).dtype


def systems_for(model: str, dtype: str, compare: bool, kv_cache_tokens: int,
                baseline_dtype: torch.dtype = torch.float32) -> list[tuple[str, object]]:
    from runtime.loading.sources import resolve_model_path

    path = str(resolve_model_path(model))
    factories: list[tuple[str, object]] = [
        ("radixserve", lambda: RadixSystem("radixserve", model, dtype, kv_cache_tokens)),
    ]
    if compare:
        factories += [
            ("radixserve-nocache", lambda: RadixSystem("radixserve-nocache", model, dtype, kv_cache_tokens,
                                                       enable_prefix_cache=False)),
            ("radixserve-fcfs", lambda: RadixSystem("radixserve-fcfs", model, dtype, kv_cache_tokens,
                                                    schedule_policy="fcfs")),
            ("transformers-batched", lambda: TransformersSystem("transformers-batched", path, batched=True,
                                                                dtype=baseline_dtype)),
            ("transformers-naive", lambda: TransformersSystem("transformers-naive", path, batched=False,
                                                              dtype=baseline_dtype)),
        ]
    return factories


def benchmark(workload_name: str, model: str = "default", scale: str = "small", compare: bool = False,
              dtype: str = "auto", kv_cache_tokens: int = 65536, skip: tuple[str, ...] = (),
              baseline_dtype: str = "auto") -> dict[str, object]:
    rows = []
    tf_dtype = transformers_dtype(baseline_dtype) if compare else torch.float32
    for name, factory in systems_for(model, dtype, compare, kv_cache_tokens, tf_dtype):
        if name in skip:
            continue
        system = factory()  # type: ignore[operator]
        try:
            workload = make_workload(workload_name, scale)
            rows.append(run_workload(system, workload).row())
        finally:
            system.close()
        print(_format_row(rows[-1], rows[0]), flush=True)
    return {"workload": workload_name, "model": model, "scale": scale,
            "transformers_dtype": str(tf_dtype).removeprefix("torch."), "systems": rows}


def _format_row(row: dict[str, object], base: dict[str, object]) -> str:
    ratio = row["requests_per_s"] / base["requests_per_s"] if base["requests_per_s"] else 0.0  # type: ignore[operator]
    hit = row["cache_hit_rate"]
    ttft = row["ttft_p50_s"]
    return (f"{row['name']:>22}  {row['requests_per_s']:7.2f} req/s  {row['input_tokens_per_s']:8.1f} in tok/s  "
            f"{row['output_tokens_per_s']:7.1f} out tok/s  hit {'-' if hit is None else f'{hit:.0%}':>4}  "
            f"ttft p50 {'-' if ttft is None else f'{ttft:.2f}s'}  ({ratio:.2f}x radixserve)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--model", default="default")
    parser.add_argument("--scale", default="small", choices=sorted(SCALES))
    parser.add_argument("--compare", action="store_true", help="also cache off, fcfs, transformers batched and naive")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-tokens", type=int, default=65536)
    parser.add_argument("--skip", nargs="*", default=[], help="systems to leave out (e.g. transformers-naive)")
    parser.add_argument("--transformers-dtype", default="auto", choices=["auto", *DTYPES],
                        help="the transformers baselines' dtype (auto: this machine's best for them)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    result = benchmark(args.workload, args.model, args.scale, args.compare, args.dtype, args.kv_cache_tokens,
                       tuple(args.skip), args.transformers_dtype)
    if args.compare:
        print(f"transformers baselines in {result['transformers_dtype']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    base = result["systems"][0]["requests_per_s"] or 1.0  # type: ignore[index]
    if len(result["systems"]) > 1:  # type: ignore[arg-type]
        print("radixserve speed-up (requests/s) over each:", ", ".join(
            f"{r['name']} {base / r['requests_per_s']:.2f}x" for r in result["systems"][1:]  # type: ignore[index]
            if r["requests_per_s"]))


if __name__ == "__main__":
    main()
