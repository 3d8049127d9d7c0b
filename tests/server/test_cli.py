"""The command line as users run it: `python -m server` in its own process, then SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import openai

from server.cli import parse
from tests.server.harness import free_port, wait_healthy


def test_flags_are_generated_from_engine_args() -> None:
    args, settings = parse(["--model", "m", "--max-running-requests", "7", "--disable-radix-cache",
                            "--page-size", "4", "--schedule-policy", "fcfs", "--kv-cache-tokens", "99",
                            "--chunked-prefill-size", "64", "--dtype", "float32", "--api-key", "k",
                            "--served-model-name", "x", "--port", "1234", "--log-level", "warning"])
    assert (args.model, args.max_running_requests, args.enable_prefix_cache, args.page_size) == ("m", 7, False, 4)
    assert (args.schedule_policy, args.kv_cache_tokens, args.chunked_prefill_size, args.dtype) == ("fcfs", 99, 64, "float32")
    assert (settings.api_key, settings.served_model_name, settings.port, settings.host) == ("k", "x", 1234, "127.0.0.1")
    default_args, default_settings = parse([])
    assert default_args.model == "default" and default_settings.port == 30000


def test_server_process_serves_and_stops_on_sigterm(tiny_folder: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server", "--model", str(tiny_folder), "--port", str(port),
                             "--kv-cache-tokens", "512", "--dtype", "float32", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout=120)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        out = client.completions.create(model=str(tiny_folder), prompt="hello", max_tokens=3, temperature=0)
        assert out.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal as its exit status
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.stdout.read() if proc.stdout else ""
    assert f"http://127.0.0.1:{port}/v1" in output
    assert "radixserve: engine stopped" in output  # the lifespan shutdown ran
