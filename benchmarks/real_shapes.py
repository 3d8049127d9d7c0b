"""`make bench-shapes`: radixserve and llama.cpp on the same Q4_K_M files, at the sizes people run.

Rows: random-weight GGUFs with the layer shapes of Llama-3.2-1B, Qwen2.5-7B and Qwen3-30B-A3B
(benchmarks/shapes_gguf.py writes them, llama.cpp's own quantizer makes them Q4_K_M; `--rows`
says how many layers each gets), and the real weights of the built-in Qwen2.5-Coder-1.5B-Instruct
(its GGUF joined from the `coder-model` extra's parts, SHA-256 checked). For each row, each system
is started alone as an OpenAI-compatible server on 127.0.0.1 on THE SAME FILE, measured and
stopped: radixserve (`python -m server --model FILE.gguf`, this checkout) and llama.cpp
(`llama-cpp-python[server]`, the peer venv of benchmarks/peers.py), both with a 4,096-token KV
budget. Figures (median of `--trials`): prompt tok/s (one unique ~500-token prompt, 1 token out),
one stream tok/s (128 tokens, after the first), 16 streams tok/s (16 x 64 tokens at once), peak
RSS (VmHWM of the server process and its children, read before it is stopped) and start-up s
(to the first answer of /v1/models, after a run that already converted or read the file). One
stream is also put against the memory bandwidth measured here: bytes a token reads from the
file's tensors (benchmarks/memory_bound.py) x tok/s / the copy bandwidth.
Results: benchmarks/results/real_shapes.json and .md (the CPU kind and the date in both).

    python -m benchmarks.real_shapes [--rows llama-3.2-1b:16 coder-1.5b qwen2.5-7b:28 ...] [--trials 2]
        [--prepare-only] [--append] [--systems radixserve radixserve-int8-activations llama.cpp]

`--systems` may add radixserve-int8-activations: radixserve with `--int8-activations` (its Q4_K
layers over activations rounded to int8, as llama.cpp's arithmetic; opt-in, docs/cpu.md), in the
docs' table, and in the README's between the default and llama.cpp where every row measured it.

`--prepare-only` writes the files and converts them for radixserve, measuring nothing (it needs no
quiet machine); `--append` keeps the JSON's other rows (each row carries the bandwidth and the
time of its own run), so rows can be measured one run at a time. Every run whose figures are
reported holds the machine alone (`flock -x /tmp/radixserve-bench.lock`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import memory_bound, peer_figures
from benchmarks.peers import RESULTS, _venv, cpu_name
from benchmarks.shapes_gguf import SHAPES, ensure_shape_gguf, shapes_dir
from server.processes import free_port, stop, wait_healthy

CODER_ROW = "coder-1.5b"
KV_TOKENS = 4096
SYSTEMS = ("radixserve", "llama.cpp")  # the README's pair
# also measurable (--systems): radixserve with llama.cpp's arithmetic for Q4_K, int8 activations (docs/cpu.md)
INT8 = "radixserve-int8-activations"
CHOICES = (*SYSTEMS, INT8)


def llama_python() -> Path:
    return _venv("llama.cpp", ["llama-cpp-python[server]"])


def coder_gguf() -> Path:
    """The built-in 1.5B's GGUF, joined once from its packages (every SHA-256 checked) into the shapes cache."""
    from runtime.loading.builtin_models import QWEN2_5_CODER_1_5B_INSTRUCT, assemble_gguf

    target = shapes_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        assemble_gguf(QWEN2_5_CODER_1_5B_INSTRUCT, partial)
        partial.rename(target)
    return target


def row_label(row: str) -> str:
    """`coder-1.5b`, or `SHAPE:LAYERS` for a row spelled `SHAPE[:LAYERS]`."""
    if row == CODER_ROW:
        return row
    name, _, layers = row.partition(":")
    if name not in SHAPES:
        raise ValueError(f"--rows: {row!r} is neither {CODER_ROW} nor one of {sorted(SHAPES)} (with :LAYERS)")
    return f"{name}:{int(layers) if layers else SHAPES[name].layers}"


def row_file(row: str) -> tuple[str, Path, str]:
    """(label, file, what it is) for a row spelled `coder-1.5b` or `SHAPE[:LAYERS]`."""
    label = row_label(row)
    if label == CODER_ROW:
        return label, coder_gguf(), "Qwen2.5-Coder-1.5B-Instruct, real weights (28 of 28 layers)"
    name, _, layers = label.partition(":")
    shape = SHAPES[name]
    count = int(layers)
    path = ensure_shape_gguf(shape, count, coder_gguf(), llama_python(), log=lambda m: print(m, flush=True))
    return f"{name}:{count}", path, f"{shape.title} shape, random weights ({count} of {shape.layers} layers)"


def command(system: str, path: Path, port: int) -> list[str]:
    host = ["--host", "127.0.0.1", "--port", str(port)]
    if system in ("radixserve", INT8):
        return [sys.executable, "-m", "server", "--model", str(path), "--served-model-name", "default",
                "--kv-cache-tokens", str(KV_TOKENS), "--log-level", "warning", *host,
                *(["--int8-activations"] if system == INT8 else [])]
    return [str(llama_python()), "-m", "llama_cpp.server", "--model", str(path), "--model_alias", "default",
            "--n_ctx", str(KV_TOKENS), "--n_threads", str(os.cpu_count() or 2), *host]


def prepare(system: str, path: Path) -> None:
    """What a first start does once (our conversion of the file and the block layers kept from it,
    runtime/cpu/block_cache.py; the file read into the page cache), so that start-up is measured on
    a cached model: for us, a start run to health and stopped (a no-op where it is cached already)."""
    if system in ("radixserve", INT8):
        port = free_port()
        proc = subprocess.Popen(command(system, path, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=str(Path(__file__).resolve().parents[1]))
        try:
            wait_healthy(proc, port, system, timeout=1800, path="/v1/models")
        finally:
            stop(proc, timeout=60)
    with path.open("rb") as f:
        while f.read(1 << 24):
            pass


async def _figures(url: str, trials: int) -> dict[str, float]:
    client = peer_figures.Client(url, "default")
    try:
        await client.complete(peer_figures.text(16, seed=1), 4)  # warm-up
        prompt, one, many, prompt_tokens = [], [], [], 0
        for trial in range(trials):
            start = time.perf_counter()
            out = await client.complete(peer_figures.text(460, seed=7000 + trial), 1)
            prompt_tokens = out["usage"]["prompt_tokens"]
            prompt.append(prompt_tokens / (time.perf_counter() - start))
            one.append(await client.stream_rate(peer_figures.text(24, seed=8000 + trial), 128))
            prompts = [peer_figures.text(24, seed=9000 + 100 * trial + i) for i in range(16)]
            start = time.perf_counter()
            outs = await asyncio.gather(*(client.complete(p, 64) for p in prompts))
            many.append(sum(o["usage"]["completion_tokens"] for o in outs) / (time.perf_counter() - start))
        return {"prompt_tok_s": statistics.median(prompt), "prompt_tokens": prompt_tokens,
                "one_stream_tok_s": statistics.median(one), "streams16_tok_s": statistics.median(many)}
    finally:
        await client.close()


def measure(system: str, path: Path, trials: int) -> dict:
    prepare(system, path)
    port = free_port()
    log = RESULTS / "tmp" / f"shapes-{system}-{path.stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(command(system, path, port), stdout=out, stderr=subprocess.STDOUT,
                                cwd=str(Path(__file__).resolve().parents[1]))
    try:
        startup = wait_healthy(proc, port, system, timeout=1800, path="/v1/models")
        figures = asyncio.run(_figures(f"http://127.0.0.1:{port}/v1", trials))
        return {"system": system, "startup_s": startup, **figures, "peak_rss_bytes": memory_bound.peak_rss(proc.pid)}
    finally:
        stop(proc, timeout=60)


def _short(commit: str) -> str:
    head, _, rest = commit.partition(" + uncommitted ")
    return f"{head} + {len(rest.split(', '))} uncommitted runtime files" if rest else head


def markdown(report: dict) -> str:
    bw = report["bandwidth"]
    lines = [f"CPU: {report['cpu']}; each server alone but for this client; figures are medians of the trials; "
             f"KV budget {KV_TOKENS} tokens each. Bandwidth measured with each row (the last: copy "
             f"{bw['copy_gb_s']:.1f} GB/s, read + written; read {bw['read_gb_s']:.1f} GB/s). Rows measured "
             + "; ".join(f"{r['row']} {r['date']} at {_short(r['commit'])}, {r.get('trials', report['trials'])} trials"
                         for r in report["rows"]) + ".", "",
             "| model (file) | system | prompt tok/s | one stream tok/s | 16 streams tok/s | peak RSS GiB | "
             "start-up s | one stream, of copy bandwidth |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        label = f"{row['what']} ({row['file_gib']:.2f} GiB, {row['bytes_per_token'] / 2**20:.0f} MiB read/token)"
        for r in row["systems"]:
            if "error" in r:
                lines.append(f"| {label} | {r['system']} | not measured: {r['error']} | | | | | |")
                continue
            lines.append(f"| {label} | {r['system']} | {r['prompt_tok_s']:,.0f} | {r['one_stream_tok_s']:.1f} | "
                         f"{r['streams16_tok_s']:,.1f} | {r['peak_rss_bytes'] / 2**30:.2f} | {r['startup_s']:.1f} | "
                         f"{100 * r['bandwidth_fraction']:.0f}% |")
    return "\n".join(lines)


def compact(report: dict) -> str:
    """The README's table: each row's figures as radixserve / llama.cpp, or, where every row also
    measured it, radixserve / radixserve --int8-activations / llama.cpp."""
    rows = [row for row in report["rows"]
            if set(SYSTEMS) <= {r["system"] for r in row["systems"] if "error" not in r}]
    with_int8 = bool(rows) and all(INT8 in {r["system"] for r in row["systems"] if "error" not in r} for row in rows)
    shown = (SYSTEMS[0], INT8, SYSTEMS[1]) if with_int8 else SYSTEMS
    lines = [f"CPU: {report['cpu']}; rows measured (medians of the trials) "
             + "; ".join(f"{r['row']} {r['date']}, {r.get('trials', report['trials'])} trials" for r in report["rows"])
             + "; " + " / ".join("radixserve --int8-activations" if s == INT8 else s for s in shown) + " on the same file",
             "", "| file | prompt tok/s | one stream tok/s | 16 streams tok/s | peak RSS GiB | start-up s |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        by = {r["system"]: r for r in row["systems"] if "error" not in r}

        def pair(key: str, spec: str, scale: float = 1.0) -> str:
            return " / ".join(f"{by[s][key] / scale:{spec}}" for s in shown)

        lines.append(f"| {row['what']} | {pair('prompt_tok_s', ',.0f')} | {pair('one_stream_tok_s', '.1f')} | "
                     f"{pair('streams16_tok_s', '.1f')} | {pair('peak_rss_bytes', '.2f', 2**30)} | "
                     f"{pair('startup_s', '.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=["llama-3.2-1b", CODER_ROW, "qwen2.5-7b", "qwen3-30b-a3b:12"])
    parser.add_argument("--systems", nargs="+", choices=CHOICES, default=list(SYSTEMS))
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS / "real_shapes.json")
    parser.add_argument("--prepare-only", action="store_true", help="write and convert the files; measure nothing")
    parser.add_argument("--append", action="store_true", help="keep the JSON's rows that this run does not measure")
    args = parser.parse_args(argv)
    root = str(Path(__file__).resolve().parents[1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    # The checkout is shared: uncommitted changes to the runtime are part of what was measured.
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "runtime", "kernels", "server"], capture_output=True,
                           text=True, cwd=root).stdout.split("\n")
    if any(line.strip() for line in dirty):
        commit += " + uncommitted " + ", ".join(line[3:] for line in dirty if line.strip())
    if args.prepare_only:
        for row in args.rows:
            _, path, _ = row_file(row)
            for system in args.systems:
                if system in ("radixserve", INT8):  # each keeps its own block layers (block_cache.py)
                    prepare(system, path)
        return {}
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report: dict = {"cpu": cpu_name(), "date": date, "commit": commit, "trials": args.trials,
                    "bandwidth": memory_bound.stream_bandwidth(), "rows": []}
    if args.append and args.json.is_file():
        old = json.loads(args.json.read_text())
        report["rows"] = [{"trials": old["trials"], **r} for r in old["rows"] if r["row"] not in {row_label(x) for x in args.rows}]
    print(json.dumps(report["bandwidth"]), flush=True)
    for row in args.rows:
        label, path, what = row_file(row)
        per_token = memory_bound.bytes_per_token(path)
        entry = {"row": label, "what": what, "file": str(path), "file_gib": path.stat().st_size / 2**30,
                 "bytes_per_token": per_token, "date": date, "trials": args.trials, "commit": commit, "bandwidth": report["bandwidth"],
                 "systems": []}
        for system in args.systems:
            try:
                result = measure(system, path, args.trials)
                result["bandwidth_fraction"] = per_token * result["one_stream_tok_s"] / (report["bandwidth"]["copy_gb_s"] * 1e9)
            except Exception as exc:  # noqa: BLE001 - one system failing on one file is reported, not fatal
                result = {"system": system, "error": repr(exc)[:300]}
            entry["systems"].append(result)
            print(json.dumps({"row": label, **result}), flush=True)
        report["rows"].append(entry)
    report["markdown"] = markdown(report)
    print(report["markdown"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    args.json.with_suffix(".md").write_text(report["markdown"] + "\n")
    from benchmarks.results_page import DOCS, README, write_section

    write_section(README, "bench-shapes", compact(report))  # between markers, where the pages have them
    write_section(DOCS, "bench-shapes", report["markdown"])
    return report


if __name__ == "__main__":
    main()
