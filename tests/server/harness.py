"""Start a real server on a free 127.0.0.1 port: uvicorn in a thread over an Engine (`serve`), or
`python -m server` as a user starts it, in its own process (`server_process`)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from runtime import Engine
from server import processes
from server.app import build_app
from server.common.state import ServerSettings
from server.processes import free_port


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy in {timeout:.0f}s")


@dataclass
class RunningServer:
    url: str
    engine: Engine
    settings: ServerSettings


@contextmanager
def serve(engine: Engine, **settings: object) -> Iterator[RunningServer]:
    port = free_port()
    cfg = ServerSettings(port=port, **settings)  # type: ignore[arg-type]
    app = build_app(engine, cfg, own_engine=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    try:
        yield RunningServer(url, engine, cfg)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextmanager
def server_process(*args: str, log: Path | None = None, timeout: float = 180) -> Iterator[str]:
    """`python -m server ARGS` on a free port, its output in `log` (or dropped); yields its URL and
    stops it afterwards."""
    port = free_port()
    sink = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "server", *args, "--port", str(port)], stdout=sink,
                            stderr=subprocess.STDOUT)
    try:
        processes.wait_healthy(proc, port, "python -m server", timeout=timeout)
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop(proc)
        if log is not None:
            sink.close()  # type: ignore[union-attr]
