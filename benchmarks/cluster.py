"""Scale-out on one machine: 1 replica vs 2 behind the SGLang router, and cache_aware vs round_robin.

Each configuration is started with `python -m server.cluster` (the router in front even for one
replica, so every row pays the same hop), driven by the load generator (benchmarks/serving.py)
with the shared-prefix workload, and read back from each replica's stats: requests/s, output
tokens/s, and the prompt-token cache hit rate over the whole cluster.

    python -m benchmarks.cluster [--model default] [--scale medium] [--concurrency 8]
        [--json benchmarks/results/cluster.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving import run as load
from server.processes import free_port

CONFIGS = [(1, "cache_aware"), (2, "cache_aware"), (2, "round_robin")]


def measure(model: str, dp: int, policy: str, scale: str, concurrency: int, extra: list[str]) -> dict:
    port = free_port()
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    argv = [sys.executable, "-m", "server.cluster", "--model", model, "--dp-size", str(dp), "--port", str(port),
            "--worker-base-port", str(port + 50), "--policy", policy, *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        while "replicas behind the SGLang router" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()[-3000:])
            time.sleep(0.5)
        report = asyncio.run(load(f"http://127.0.0.1:{port}/v1", None, "shared-prefix", scale, concurrency, None,
                                  10_000, 600.0))
        ports = [int(p) for p in re.findall(r"replica \d: pid \d+, port (\d+)", log.read_text())]
        stats = [httpx.get(f"http://127.0.0.1:{p}/get_server_info", timeout=10).json()["stats"] for p in ports]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    prompt = sum(s["prompt_tokens_total"] for s in stats)
    return {"replicas": dp, "policy": policy, "requests_per_s": report.requests_per_s,
            "output_tokens_per_s": report.output_tokens_per_s, "succeeded": report.succeeded, "failed": report.failed,
            "cache_hit_rate": sum(s["cached_tokens_total"] for s in stats) / prompt if prompt else 0.0,
            "prompt_tokens_per_replica": [s["prompt_tokens_total"] for s in stats], "report": asdict(report)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--scale", default="medium")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args, extra = parser.parse_known_args(argv)
    rows = []
    for dp, policy in CONFIGS:
        row = measure(args.model, dp, policy, args.scale, args.concurrency, extra)
        rows.append(row)
        print(f"{dp} replica(s), {policy:>11}: {row['requests_per_s']:6.2f} req/s, {row['output_tokens_per_s']:7.1f} "
              f"tok/s, cache hit {100 * row['cache_hit_rate']:5.1f}%, {row['failed']} failed", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
