"""An asyncio load generator for any OpenAI-compatible endpoint (ours or a peer's).

Streams /v1/completions with a request rate (Poisson arrivals) or a fixed concurrency, and
reports TTFT, TPOT, throughput and success counts as JSON. Bounded in count and time; it
sends traffic only to the URL given (use 127.0.0.1).

    python -m benchmarks.serving --base-url http://127.0.0.1:30000/v1 --workload shared-prefix --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.workloads import SCALES, WORKLOADS, make_workload


@dataclass
class Sample:
    ok: bool
    ttft_s: float | None = None
    latency_s: float | None = None
    output_tokens: int = 0
    error: str | None = None


@dataclass
class ServingReport:
    base_url: str
    workload: str
    requests: int
    succeeded: int
    failed: int
    seconds: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    latency_p50_s: float | None
    errors: list[str] = field(default_factory=list)


async def one_request(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, timeout: float) -> Sample:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", "/completions", json=body, timeout=timeout) as resp:
            if resp.status_code != 200:
                return Sample(False, error=f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Sample(False, error=event["error"].get("message"))
                if event.get("choices") and event["choices"][0].get("text") and first is None:
                    first = time.perf_counter()
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        return Sample(False, error=repr(exc))
    end = time.perf_counter()
    return Sample(True, (first or end) - start, end - start, tokens)


async def run(base_url: str, model: str | None, workload: str, scale: str, concurrency: int,
              request_rate: float | None, max_requests: int, timeout: float, seed: int = 0) -> ServingReport:
    requests = [r for build in make_workload(workload, scale, seed).phases[:1] for r in build([])][:max_requests]
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout) as client:
        if model is None:
            model = (await client.get("/models")).json()["data"][0]["id"]
        gate = asyncio.Semaphore(concurrency)

        async def guarded(req) -> Sample:  # noqa: ANN001
            async with gate:
                return await one_request(client, model, req.prompt, req.max_new_tokens, timeout)

        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(guarded(req)))
            if request_rate:
                await asyncio.sleep(rng.expovariate(request_rate))
        samples = await asyncio.gather(*tasks)
        seconds = time.perf_counter() - start
    ok = [s for s in samples if s.ok]
    tpots = [(s.latency_s - s.ttft_s) / (s.output_tokens - 1) for s in ok if s.output_tokens > 1]

    def pct(values: list[float], p: int) -> float | None:
        if not values:
            return None
        values = sorted(values)
        return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]

    return ServingReport(base_url, workload, len(samples), len(ok), len(samples) - len(ok), seconds,
                         len(ok) / seconds, sum(s.output_tokens for s in ok) / seconds,
                         pct([s.ttft_s for s in ok], 50), pct([s.ttft_s for s in ok], 90), pct(tpots, 50),
                         pct([s.latency_s for s in ok], 50), [s.error for s in samples if s.error][:5])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:30000/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--workload", default="shared-prefix", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", default="small", choices=sorted(SCALES))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--request-rate", type=float, default=None, help="requests/s (Poisson); default: all at once")
    parser.add_argument("--max-requests", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.base_url, args.model, args.workload, args.scale, args.concurrency,
                             args.request_rate, args.max_requests, args.timeout))
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
