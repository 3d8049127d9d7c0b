"""`Runtime(model_path=...)`: start a local radixserve server process and use it as a backend, as SGLang's
`sgl.Runtime` does.

    runtime = Runtime(model_path="default", chunked_prefill_size=256)
    set_default_backend(runtime)
    ...
    runtime.shutdown()

Keyword arguments are server flags (`python -m server --help`), with SGLang's names accepted where
ours differ (`mem_fraction_static`, `max_total_tokens`, `random_seed`, ...). The server listens on a
free 127.0.0.1 port; `url` says where. The process is stopped by `shutdown()`, by leaving a `with`
block, or when the Python process exits.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile

from frontend_lang.backends.base import BackendError
from frontend_lang.backends.runtime_endpoint import RuntimeEndpoint
from server.processes import free_port, stop, wait_healthy

# SGLang's server-argument names -> ours (flags of `python -m server`).
SGLANG_NAMES = {"mem_fraction_static": "kv_cache_memory_fraction", "max_total_tokens": "kv_cache_tokens",
                "random_seed": "seed", "disable_radix_cache": "disable_radix_cache",
                "max_prefill_tokens": "max_prefill_tokens", "log_level": "log_level"}
# Accepted for compatibility where they ask for what a single local process is anyway.
NEUTRAL = {"tp_size": 1, "dp_size": 1, "trust_remote_code": None, "skip_tokenizer_init": False}
SERVER_FLAGS = ("host", "api_key", "served_model_name", "max_request_body_bytes", "log_level", "log_requests")


def server_argv(model_path: str, port: int, options: dict[str, object]) -> list[str]:
    """The `python -m server` command line for these Runtime keyword arguments."""
    from runtime.engine_args import EngineArgs

    known = set(EngineArgs.field_names()) | set(SERVER_FLAGS) | {"disable_radix_cache"}
    argv = [sys.executable, "-m", "server", "--model", model_path, "--port", str(port)]
    unknown = []
    for key, value in options.items():
        if key in NEUTRAL:
            if NEUTRAL[key] is not None and value != NEUTRAL[key]:
                raise ValueError(f"Runtime({key}={value!r}): one local process only; use server.cluster to scale out")
            continue
        name = SGLANG_NAMES.get(key, key)
        if name not in known:
            unknown.append(key)
            continue
        if name == "enable_prefix_cache":
            name, value = "disable_radix_cache", not value
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if name in ("disable_radix_cache", "log_requests"):
                argv += [flag] if value else []
            else:
                argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            argv += [flag, str(value)]
    if unknown:
        raise ValueError(f"Runtime: unknown server argument(s) {sorted(unknown)}; see `python -m server --help`")
    return argv


class Runtime(RuntimeEndpoint):
    def __init__(self, model_path: str = "default", startup_timeout: float = 600.0, **options: object) -> None:
        self.port = int(options.pop("port", 0) or free_port())  # type: ignore[arg-type]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="radixserve-runtime-", suffix=".log", delete=False)
        argv = server_argv(model_path, self.port, options)
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=os.environ.copy())
        atexit.register(self.shutdown)
        try:
            self._wait_healthy(startup_timeout)
            super().__init__(self.url, api_key=options.get("api_key"))  # type: ignore[arg-type]
        except BaseException:
            self.shutdown()
            raise

    @property
    def endpoint(self) -> Runtime:  # SGLang code reads runtime.endpoint
        return self

    def _wait_healthy(self, timeout: float) -> None:
        try:
            wait_healthy(self.process, self.port, "the server", timeout)
        except RuntimeError as exc:
            raise BackendError(f"{exc}:\n{self.log_tail()}") from exc

    def log_tail(self, chars: int = 4000) -> str:
        with open(self._log.name, errors="replace") as handle:
            return handle.read()[-chars:]

    def shutdown(self) -> None:
        """Stop the server process (SIGTERM, then SIGKILL after 15 s). Safe to call twice."""
        process = getattr(self, "process", None)
        if process is not None:
            stop(process, timeout=15)
        client = getattr(self, "client", None)
        if client is not None:
            client.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
