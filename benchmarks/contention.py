"""Serving figures when the machine is shared: idle, with a busy neighbour, and under a CPU quota.

A server rarely has its cores to itself: its clients, a RAG pipeline, a load tool, another replica.
Each system is started as a server in its own session (as a service is), and measured by the same
client (this process) under three conditions, one after another:
- idle: nothing else runs;
- busy: one other process spins on one core, in its own session (`python3 -c 'while True: pass'`);
- quota: the server in a cgroup with a CPU quota of 1.5 cores (`docker --cpus=1.5`), where this
  process may make one (cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`); else pinned to one core
  (`taskset -c 0`), and the table says which.
Figures, each the median of `trials`: prompt (a unique ~500-token prompt, 1 token) tok/s, one
stream of 64 tokens (tok/s after the first), 8 concurrent streams x 64 tokens (tok/s in all).
Systems: `radixserve` (its defaults: the CPU threads follow what other processes leave,
runtime/cpu/thread_budget.py), `radixserve-fixed` (`--no-adapt-cpu-threads`: every core's thread
whatever else runs, as before), and `llama.cpp` (benchmarks/peers.py installs it from PyPI into
benchmarks/.peers/; 2 threads on the same GGUF). Results: benchmarks/results/contention.json, and a
markdown table (contention.md) naming the CPU.

    python -m benchmarks.contention [--systems radixserve radixserve-fixed llama.cpp] [--trials 3] [--ab-rounds 3]

`--ab-rounds N` adds an idle A/B: radixserve and radixserve-fixed alternately, N rounds, a new server
each time (what the governor costs when nothing else runs, told apart from run-to-run noise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import peer_figures, peers
from benchmarks.peer_figures import Client, neighbour, text
from server.processes import stop, wait_healthy

RESULTS = Path(__file__).resolve().parent / "results"
CONDITIONS = ("idle", "busy", "quota")
FIGURES = [("prompt_tok_s", "prompt (~500 tokens), tok/s", ",.0f"), ("one_stream_tok_s", "one stream, tok/s", ".1f"),
           ("streams8_tok_s", "8 streams, total tok/s", ".1f")]
QUOTA_CORES = 1.5


async def _figures(base_url: str, trials: int, condition: int) -> dict[str, float]:
    client = Client(base_url, "default")
    try:
        await client.complete(text(16, seed=1), 4)  # warm-up
        got: dict[str, list[float]] = {key: [] for key, _, _ in FIGURES}
        for trial in range(trials):
            prompt = text(460, seed=7000 + 100 * condition + trial)  # never cached before
            start = time.perf_counter()
            out = await client.complete(prompt, 1)
            got["prompt_tok_s"].append(out["usage"]["prompt_tokens"] / (time.perf_counter() - start))
            got["one_stream_tok_s"].append(await client.stream_rate(text(24, seed=8000 + trial), 64))
            got["streams8_tok_s"].append(await peer_figures._streams(client, 8, 64, trial))
        figures = {key: statistics.median(values) for key, values in got.items()}
        changes = await _thread_changes(client)
        if changes is not None:  # radixserve: how often its thread count moved while these ran
            figures["cpu_threads_changes_total"] = changes
        return figures
    finally:
        await client.close()


async def _thread_changes(client: Client) -> float | None:
    """radixserve's count of thread-count changes so far (its /get_server_info stats); None elsewhere."""
    base = str(client.http.base_url).removesuffix("/v1/")
    try:
        response = await client.http.get(base + "/get_server_info")
        return response.json()["stats"].get("cpu_threads_changes_total") if response.status_code == 200 else None
    except (ValueError, KeyError, httpx.HTTPError):
        return None


class CpuQuota:
    """A cgroup with a CPU quota that a started process is moved into, where this process may make one."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.folder: Path | None = None
        self.procs = ""
        root = Path("/sys/fs/cgroup")
        period = 100_000
        if (root / "cgroup.controllers").exists():  # v2
            base, files = root, {"cpu.max": f"{int(cores * period)} {period}"}
        else:  # v1
            base, files = root / "cpu", {"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(int(cores * period))}
        folder = base / f"radixserve-contention-{os.getpid()}"
        try:
            folder.mkdir()
            for file, value in files.items():
                (folder / file).write_text(value)
            self.folder = folder
        except OSError:  # not ours to make (no root, or the controller is not delegated): pin instead
            with contextlib.suppress(OSError):
                folder.rmdir()

    @property
    def label(self) -> str:
        return f"quota {self.cores:g} cores (cgroup)" if self.folder else "pinned to one core (taskset)"

    def enter(self, pid: int) -> None:
        if self.folder is not None:
            (self.folder / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        if self.folder is not None:
            with contextlib.suppress(OSError):
                self.folder.rmdir()


def _start(python: Path, args: list[str], log: Path, quota: CpuQuota | None) -> subprocess.Popen:
    one_core = {min(os.sched_getaffinity(0))}
    pin = (lambda: os.sched_setaffinity(0, one_core)) if quota is not None and quota.folder is None else None
    with open(log, "w") as out:
        proc = subprocess.Popen([str(python), *args], stdout=out, stderr=subprocess.STDOUT, cwd=str(peers.ROOT.parent),
                                start_new_session=True, preexec_fn=pin)  # noqa: PLW1509 - only sets the CPU mask
    if quota is not None:
        quota.enter(proc.pid)  # before the model loads: the server sizes its threads from it
    return proc


def measure(name: str, venv: str | None, packages: list[str], args: list[str], port: int, trials: int,
            quota: CpuQuota) -> dict:
    python = Path(sys.executable) if venv is None else peers._venv(venv, packages)
    log = RESULTS / "tmp" / f"contention-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/v1"
    result: dict = {"name": name}
    proc = _start(python, args, log, None)
    try:
        wait_healthy(proc, port, name, timeout=900, path="/v1/models")
        result["idle"] = asyncio.run(_figures(url, trials, 0))
        print(f"  {name} idle: {result['idle']}", flush=True)
        with neighbour():
            result["busy"] = asyncio.run(_figures(url, trials, 1))
        print(f"  {name} busy: {result['busy']}", flush=True)
    finally:
        stop(proc, timeout=60)
    proc = _start(python, args, log.with_suffix(".quota.log"), quota)
    try:
        wait_healthy(proc, port, name, timeout=900, path="/v1/models")
        result["quota"] = asyncio.run(_figures(url, trials, 2))
        print(f"  {name} quota: {result['quota']}", flush=True)
    finally:
        stop(proc, timeout=60)
    return result


def idle_ab(table: dict, rounds: int, port: int, trials: int) -> dict:
    """radixserve against radixserve-fixed with nothing else running, alternating `rounds` times (a new
    server each time), so that what the thread governor costs an idle machine is told from noise."""
    got: dict[str, list[dict[str, float]]] = {"radixserve": [], "radixserve-fixed": []}
    for round_ in range(rounds):
        # ABBA order: whichever goes first in a round is not always the same one (a slow spell of the
        # machine then falls on both)
        for name in (list(got) if round_ % 2 == 0 else list(got)[::-1]):
            _, _, args = table[name]
            proc = _start(Path(sys.executable), args, RESULTS / "tmp" / f"contention-ab-{name}.log", None)
            try:
                wait_healthy(proc, port, name, timeout=900, path="/v1/models")
                got[name].append(asyncio.run(_figures(f"http://127.0.0.1:{port}/v1", trials, 10 + round_)))
                print(f"  A/B round {round_ + 1} {name}: {got[name][-1]}", flush=True)
            finally:
                stop(proc, timeout=60)
    medians = {name: {key: statistics.median(r[key] for r in runs) for key, _, _ in FIGURES} for name, runs in got.items()}
    return {"rounds": rounds, "medians": medians,
            "ratio": {key: medians["radixserve"][key] / medians["radixserve-fixed"][key] for key, _, _ in FIGURES}}


def systems(port: int) -> dict[str, tuple[str | None, list[str], list[str]]]:
    table = peers.systems(port)
    ours = table["radixserve"]
    return {"radixserve": ours, "radixserve-fixed": (None, [], [*ours[2], "--no-adapt-cpu-threads"]),
            "llama.cpp": table["llama.cpp"]}


def markdown(report: dict) -> str:
    rows = [r for r in report["systems"] if "error" not in r]
    head = (f"CPU: {report['cpu']} ({report['date']}, median of {report['trials']} trials; busy: one process spinning "
            f"on one core; quota: {report['quota']}; the client runs on the same machine for every system)")
    lines = [head, "",
             "| figure | " + " | ".join(f"{r['name']} {c}" for r in rows for c in CONDITIONS) + " |",
             "|---|" + "---:|" * (len(rows) * len(CONDITIONS))]
    for key, label, spec in FIGURES:
        cells = []
        for r in rows:
            idle = r["idle"][key]
            for c in CONDITIONS:
                value = r[c][key]
                cells.append(f"{value:{spec}}" if c == "idle" else f"{value:{spec}} ({value / idle:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [f"\n{r['name']}: not measured ({r['error']})" for r in report["systems"] if "error" in r]
    ab = report.get("idle_ab")
    if ab:
        lines += ["", f"Idle A/B, {ab['rounds']} alternating rounds (a new server each), medians: radixserve against "
                  "radixserve-fixed:", ""]
        lines += [f"- {label}: {ab['medians']['radixserve'][key]:{spec}} against "
                  f"{ab['medians']['radixserve-fixed'][key]:{spec}} ({ab['ratio'][key]:.3f}x)" for key, label, spec in FIGURES]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="*", default=["radixserve", "radixserve-fixed", "llama.cpp"])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--port", type=int, default=30200)
    parser.add_argument("--json", default=str(RESULTS / "contention.json"))
    parser.add_argument("--ab-rounds", type=int, default=0,
                        help="also compare radixserve and radixserve-fixed idle, alternating this many rounds")
    args = parser.parse_args(argv)
    table = systems(args.port)
    quota = CpuQuota(QUOTA_CORES)
    report = {"cpu": peers.cpu_name(), "date": time.strftime("%Y-%m-%d"), "trials": args.trials,
              "quota": quota.label, "systems": []}
    try:
        for name in args.systems:
            print(f"== {name}", flush=True)
            venv, packages, server_args = table[name]
            try:
                report["systems"].append(measure(name, venv, packages, server_args, args.port, args.trials, quota))
            except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others
                report["systems"].append({"name": name, "error": str(exc)})
                print(f"  {name}: {exc}", flush=True)
        if args.ab_rounds:
            print("== idle A/B", flush=True)
            report["idle_ab"] = idle_ab(table, args.ab_rounds, args.port, args.trials)
    finally:
        quota.close()
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    md = markdown(report)
    Path(args.json).with_suffix(".md").write_text(md + "\n")
    print(md)
    return report


if __name__ == "__main__":
    main()
