"""`python -m server.cluster`: N radixserve replicas behind the SGLang router, started and stopped as one.

    python -m server.cluster --model M --dp-size 2 --port 30000 [--policy cache_aware] [server flags...]

Replicas listen on 127.0.0.1, ports P+1..P+N (`--worker-base-port B` moves them to B+1..B+N); the
router (PyPI `sglang-router`, the `.[cluster]` extra) listens on P and spreads requests over them:
`cache_aware` (the default) keeps requests that share a prefix on the replica that caches it, and
the router brings health checks, retries and a circuit breaker. Every flag this launcher does not
know is passed to each replica (`python -m server --help`). Replica and router output is
prefixed with its name; a replica that dies is reported and routed around. Ctrl-C or SIGTERM stops
every process this started.

Devices: on the CPU each replica gets an equal share of the cores (`--num-threads`). With CUDA and
at least N GPUs each replica takes one (CUDA_VISIBLE_DEVICES); with fewer, replicas share GPU 0 and
start one after another, each taking an equal share of the KV memory left.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from server import processes
from server.cli import build_parser as server_parser

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
GPU_KV_SHARE = 0.85  # of free GPU memory for all replicas together, as a single server's default


@dataclass
class Proc:
    name: str
    port: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    popen: subprocess.Popen | None = None
    reported: bool = False

    def start(self) -> None:
        self.popen = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, start_new_session=True)
        threading.Thread(target=self._relay, daemon=True).start()
        print(f"[cluster] {self.name}: pid {self.popen.pid}, port {self.port}", flush=True)

    def _relay(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for line in self.popen.stdout:
            print(f"[{self.name}] {line}", end="", flush=True)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        if self.alive:
            assert self.popen is not None
            os.killpg(self.popen.pid, signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> None:
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp-size", type=int, default=2, help="number of replicas (default: 2)")
    parser.add_argument("--host", default="127.0.0.1", help="the router's address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="the router's port (default: 30000)")
    parser.add_argument("--worker-base-port", type=int, default=None, help="replicas on B+1..B+N (default: --port)")
    parser.add_argument("--policy", default="cache_aware", choices=POLICIES, help="routing policy (default: cache_aware)")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for each process")
    parser.add_argument("--router-args", default="", help="extra flags for the router, as one string")
    return parser


def replica_commands(args: argparse.Namespace, server_flags: list[str]) -> list[Proc]:
    """The replicas' command lines and environments (devices and threads shared out)."""
    base = args.port if args.worker_base_port is None else args.worker_base_port
    ns = vars(server_parser().parse_args(server_flags))  # a bad flag fails here, before anything starts
    n = args.dp_size
    procs = []
    gpus = _cuda_devices(ns["device"])
    for i in range(n):
        port = base + 1 + i
        argv = [sys.executable, "-m", "server", *server_flags, "--host", "127.0.0.1", "--port", str(port)]
        env = dict(os.environ)
        if gpus >= n:
            env["CUDA_VISIBLE_DEVICES"] = str(i)
        elif gpus and ns["kv_cache_tokens"] is None and ns["kv_cache_memory_fraction"] is None:
            # Shared GPU, started in turn: replica i takes 1/(n - i) of what the earlier ones left.
            argv += ["--kv-cache-memory-fraction", f"{GPU_KV_SHARE / (n - i):.4f}"]
        if not gpus and ns["num_threads"] is None:
            argv += ["--num-threads", str(max(1, (os.cpu_count() or 1) // n))]
        procs.append(Proc(f"replica {i + 1}", port, argv, env))
    return procs


def _cuda_devices(device: str) -> int:
    if device == "cpu":
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def wait_healthy(proc: Proc, timeout: float) -> None:
    assert proc.popen is not None
    processes.wait_healthy(proc.popen, proc.port, proc.name, timeout)  # its output is above, prefixed


def router_command(args: argparse.Namespace, replicas: list[Proc]) -> Proc:
    urls = [f"http://127.0.0.1:{r.port}" for r in replicas]
    # Its Prometheus exporter would take a fixed port (29000): give it a free one, on loopback.
    # Its health checks run every 60 s by default, so a dead replica would be tried for minutes
    # (cache_aware keeps choosing the replica that holds a prefix): check every 5 s and open the
    # circuit after 3 failures. --router-args come last, so they override these.
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", args.host, "--port", str(args.port),
            "--worker-urls", *urls, "--policy", args.policy, "--log-level", "warn",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(processes.free_port()),
            "--health-check-interval-secs", "5", "--health-failure-threshold", "2", "--cb-failure-threshold", "3",
            *args.router_args.split()]
    return Proc("router", args.port, argv)


def main(argv: list[str] | None = None) -> int:
    args, server_flags = build_parser().parse_known_args(argv)
    if args.dp_size < 1:
        print("server.cluster: --dp-size must be >= 1", file=sys.stderr)
        return 2
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print("server.cluster needs the SGLang router: pip install -e '.[cluster]' (or `make serve-cluster`)",
              file=sys.stderr)
        return 2
    replicas = replica_commands(args, server_flags)
    router = router_command(args, replicas)
    everyone = [*replicas, router]
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        shared_gpu = any("--kv-cache-memory-fraction" in r.argv and "CUDA_VISIBLE_DEVICES" not in r.env
                         for r in replicas)
        for r in replicas:  # in turn on a shared GPU (each sizes its KV from what is free), else together
            r.start()
            if shared_gpu:
                wait_healthy(r, args.startup_timeout)
        for r in replicas:
            wait_healthy(r, args.startup_timeout)
        router.start()
        wait_healthy(router, args.startup_timeout)
        print(f"[cluster] {len(replicas)} replicas behind the SGLang router ({args.policy}) at "
              f"http://{args.host}:{args.port}/v1", flush=True)
        while not stopping.wait(0.5):
            if not router.alive:
                print(f"[cluster] the router exited with code {router.popen.returncode}; stopping", flush=True)
                code = 1
                break
            for r in replicas:
                if not r.alive and not r.reported:
                    r.reported = True
                    print(f"[cluster] {r.name} (port {r.port}) exited with code {r.popen.returncode}; "
                          f"the router routes around it", flush=True)
    except RuntimeError as exc:
        print(f"[cluster] {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        for p in reversed(everyone):
            p.stop()
        deadline = time.monotonic() + 15
        for p in everyone:
            p.wait_stopped(deadline)
        print("[cluster] stopped", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
