"""`python -m server.cluster`: two replicas behind the real SGLang router, on a tiny model.

Started as a user would (one command, a subprocess); checked through the router with the openai
client and httpx: prefix-sharing requests are served mostly from cache across the cluster, every
route works, killing a replica does not take the service down, and stopping the launcher leaves
no process and no listening port behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.harness import free_port

pytest.importorskip("sglang_router")

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "You are a careful assistant. Here is the shared context for every question: " + "the cat sat. " * 12


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Cluster:
    proc: subprocess.Popen
    url: str
    replica_ports: list[int]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in re.findall(r"\[cluster\] (replica \d|router): pid (\d+)", self.output())}


@pytest.fixture(scope="module")
def cluster(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    port, base = free_port(), free_port() + 100
    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
    argv = [sys.executable, "-m", "server.cluster", "--model", str(tiny_folder), "--dp-size", "2", "--port", str(port),
            "--worker-base-port", str(base), "--policy", "cache_aware", "--dtype", "float32",
            "--kv-cache-tokens", "4096", "--served-model-name", "tiny"]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    c = Cluster(proc, f"http://127.0.0.1:{port}", [base + 1, base + 2], log)
    deadline = time.monotonic() + 180
    while "replicas behind the SGLang router" not in c.output():
        assert proc.poll() is None and time.monotonic() < deadline, c.output()[-4000:]
        time.sleep(0.3)
    yield c
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _stats(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=10).json()["stats"]


def test_prefix_sharing_requests_hit_the_cache_across_the_cluster(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none")
    for i in range(8):
        out = client.completions.create(model="tiny", prompt=PREFIX + f"Question {i}?", max_tokens=3, temperature=0)
        assert out.usage.completion_tokens == 3
    stats = [_stats(p) for p in cluster.replica_ports]
    prompt = sum(s["prompt_tokens_total"] for s in stats)
    cached = sum(s["cached_tokens_total"] for s in stats)
    assert prompt > 0 and cached / prompt > 0.6, stats  # cache_aware kept the prefix on its replica


def test_every_route_through_the_router(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none")
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0)
    assert chat.choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    text = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0, stream=True)
    assert len([c for c in text]) >= 2
    native = httpx.post(cluster.url + "/generate", timeout=60, json={"text": "hello", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}, "return_logprob": True})
    assert native.status_code == 200, native.text
    assert native.json()["meta_info"]["completion_tokens"] == 4
    with httpx.stream("POST", cluster.url + "/generate", timeout=60,
                      json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    assert [m.id for m in client.models.list().data]


def test_a_dead_replica_does_not_take_the_service_down_and_stop_cleans_up(cluster: Cluster) -> None:
    pids = cluster.pids()
    os.killpg(pids["replica 1"], signal.SIGKILL)
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0)  # no retries of ours
    # The router notices within seconds (its circuit breaker, then health checks): a few requests
    # may fail meanwhile, and then every one is served by the replica left.
    failures, deadline = 0, time.monotonic() + 30
    while True:
        try:
            client.completions.create(model="tiny", prompt=PREFIX + "probe", max_tokens=2, temperature=0)
            break
        except openai.APIError:
            failures += 1
            assert time.monotonic() < deadline, f"still failing after {failures} tries"
            time.sleep(0.5)
    assert failures <= 5
    for i in range(6):
        out = client.completions.create(model="tiny", prompt=PREFIX + f"after {i}", max_tokens=2, temperature=0)
        assert out.usage.completion_tokens == 2
    deadline = time.monotonic() + 10
    while "replica 1 (port" not in cluster.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"replica 1 (port {cluster.replica_ports[0]}) exited" in cluster.output()
    cluster.proc.send_signal(signal.SIGTERM)
    assert cluster.proc.wait(timeout=30) == 0
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    port = int(cluster.url.rsplit(":", 1)[1])
    assert not any(_listening(p) for p in [port, *cluster.replica_ports])
