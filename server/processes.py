"""Server processes on this machine: a free loopback port, waiting until one answers /health, stopping it.

Shared by `python -m server.cluster` (replicas and the router), `frontend_lang.Runtime` and
`make bench-peers`.
Imports nothing of the engine, so client-side code may use it.
"""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(process: subprocess.Popen, port: int, name: str, timeout: float, path: str = "/health") -> float:
    """Return the seconds it took until http://127.0.0.1:port{path} answered 200; RuntimeError if the
    process exits or time runs out. (Peers without /health are asked for /v1/models.)"""
    start = time.monotonic()
    deadline = start + timeout
    url = f"http://127.0.0.1:{port}{path}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} while starting")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not become healthy in {timeout:.0f}s")


def stop(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds; safe on an exited process."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
