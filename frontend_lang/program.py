"""`@program`: a Python function over a state `s`, run on a backend once (`run`) or many times (`run_batch`)."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from frontend_lang.backends.base import Backend
from frontend_lang.backends.engine_backend import EngineBackend
from frontend_lang.global_config import global_config
from frontend_lang.ir import SAMPLING_KEYS, Concat, Gen, RoleBlock, Select
from frontend_lang.state import ProgramState

_default_backend: Backend | None = None
# Shorter shared prefixes are not worth a warm-up request of their own.
MIN_WARM_PREFIX_CHARS = 64


def set_default_backend(backend: object) -> None:
    global _default_backend
    _default_backend = _as_backend(backend)
    global_config.default_backend = _default_backend


def flush_cache(backend: object | None = None) -> bool:
    """Drop the backend's unused prefix cache (SGLang's sgl.flush_cache); False without a backend."""
    chosen = _as_backend(backend) if backend is not None else _default_backend
    return chosen.flush_cache() if chosen is not None else False


def get_server_info(backend: object | None = None) -> dict[str, object] | None:
    """The backend server's settings and stats (SGLang's sgl.get_server_info); None without one."""
    chosen = _as_backend(backend) if backend is not None else _default_backend
    return chosen.server_info() if chosen is not None else None


def _as_backend(backend: object) -> Backend:
    if isinstance(backend, Backend):
        return backend
    from runtime import Engine

    if isinstance(backend, Engine):
        return EngineBackend(backend)
    raise TypeError(f"backend must be an Engine, RuntimeEndpoint or OpenAI backend, got {type(backend).__name__}")


def _resolve(backend: object | None) -> Backend:
    if backend is not None:
        return _as_backend(backend)
    if _default_backend is None:
        raise ValueError("backend: pass backend=... or call set_default_backend() first")
    return _default_backend


class _StopTracing(Exception):
    pass


class _TracingState(ProgramState):
    """Runs a program only up to its first model call, to learn the text it starts with."""

    def __iadd__(self, expr: object) -> ProgramState:
        for part in expr.parts if isinstance(expr, Concat) else [expr]:
            if isinstance(part, (Gen, Select)):
                raise _StopTracing
            if isinstance(part, RoleBlock) and any(isinstance(p, (Gen, Select)) for p in part.parts):
                # The text before the role's first model call is still shared text.
                self._begin_role(part.role)
                for p in part.parts:
                    if isinstance(p, (Gen, Select)):
                        break
                    self._run_expr(p)
                raise _StopTracing
            self._run_expr(part)  # type: ignore[arg-type]
        return self

    def fork(self, n: int):  # noqa: ANN201 - tracing ends where the program branches
        raise _StopTracing

    def _submit(self, fn, *args) -> None:  # noqa: ANN001
        fn(*args)  # synchronously: tracing makes no model calls


class Program:
    def __init__(self, func: Callable[..., object], bound: dict[str, object] | None = None) -> None:
        functools.update_wrapper(self, func)
        self.func = func
        self.bound = dict(bound or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"@program function {func.__name__} must take the state `s` as its first argument")
        self.arg_names = params[1:]

    def bind(self, **kwargs: object) -> Program:
        """The same program with some arguments fixed (SGLang's SglFunction.bind)."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"bind(): {self.func.__name__} has no argument(s) {', '.join(unknown)}")
        return Program(self.func, {**self.bound, **kwargs})

    def __call__(self, *args: object, **kwargs: object) -> ProgramState:
        return self.run(*args, **kwargs)

    def run(self, *args: object, backend: object | None = None, stream: bool = False,
            use_thread: bool = True, **kwargs: object) -> ProgramState:
        """Run once. Raises the program's error; with stream=True returns at once (read `text_iter()`).

        use_thread is SGLang's; each state always has its own worker thread here.
        """
        defaults = _pop_defaults(kwargs, keep=self.arg_names)
        kwargs = {**self.bound, **kwargs}
        state = ProgramState(_resolve(backend), defaults, stream=stream)
        if stream:
            def body() -> None:
                try:
                    self.func(state, *args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - surfaces through text_iter / sync
                    state.fail(exc)
                state.finish()

            threading.Thread(target=body, daemon=True).start()
            return state
        self.func(state, *args, **kwargs)
        state.finish()
        state.sync()
        if global_config.verbosity >= 2:
            print(state.text())
        return state

    def run_batch(self, batch_kwargs: list[dict[str, object]] | list[list[object]], backend: object | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, generator_style: bool = False,
                  **sampling: object) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per item (a kwargs dict, or a list of positional arguments), concurrently. A
        failed item's state raises its error when read. generator_style: yield the states in
        order as they finish instead of returning the list.

        Keyword arguments beyond these are sampling defaults for every gen (temperature=..., ...).
        """
        defaults = _pop_defaults(sampling)
        if sampling:
            raise TypeError(f"run_batch() got unknown argument(s): {', '.join(sorted(sampling))} "
                            f"(sampling defaults are {', '.join(SAMPLING_KEYS)})")
        batch_kwargs = [self._as_kwargs(item) for item in batch_kwargs]
        resolved = _resolve(backend)
        if global_config.enable_precache_with_tracing:
            self._warm_common_prefix(batch_kwargs, resolved)
        if generator_style:
            return self._run_each(batch_kwargs, resolved, defaults, num_threads, progress_bar)
        return list(self._run_each(batch_kwargs, resolved, defaults, num_threads, progress_bar))

    def _as_kwargs(self, item: dict[str, object] | list[object] | tuple[object, ...]) -> dict[str, object]:
        if isinstance(item, dict):
            return {**self.bound, **item}
        if len(item) > len(self.arg_names):
            raise TypeError(f"run_batch(): {len(item)} arguments for {self.func.__name__}{tuple(self.arg_names)}")
        return {**self.bound, **dict(zip(self.arg_names, item))}

    def _run_each(self, batch_kwargs: list[dict[str, object]], resolved: Backend, defaults: dict[str, object],
                  num_threads: int | str, progress_bar: bool) -> Iterator[ProgramState]:
        workers = min(len(batch_kwargs), 64) if num_threads == "auto" else int(num_threads)

        def one(kwargs: dict[str, object]) -> ProgramState:
            state = ProgramState(resolved, dict(defaults))
            try:
                self.func(state, **kwargs)
                state.finish()
                state.sync()
            except BaseException as exc:  # noqa: BLE001 - kept in that item's state
                state._error = exc
            return state

        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            futures = [pool.submit(one, kw) for kw in batch_kwargs]
            for future in tqdm(futures, disable=not progress_bar, desc=self.func.__name__):
                yield future.result()

    def _warm_common_prefix(self, batch_kwargs: list[dict[str, object]], backend: Backend) -> None:
        """Compute the text every item starts with once, so the fan-out hits the cache."""
        if len(batch_kwargs) < 2:
            return
        texts = []
        for kwargs in batch_kwargs:
            state = _TracingState(backend)
            try:
                self.func(state, **kwargs)
            except _StopTracing:
                pass
            except Exception:  # noqa: BLE001 - a program that fails here fails for real later
                return
            texts.append(state._text)
        prefix = _common_prefix(texts)
        # Cut at a boundary the tokenizer will not merge across, so the tokens match the real prompts.
        cut = max(prefix.rfind("\n"), prefix.rfind(" "))
        prefix = prefix[:cut] if cut > 0 else ""
        if len(prefix) >= MIN_WARM_PREFIX_CHARS:
            backend.warm(prefix)


def _common_prefix(texts: list[str]) -> str:
    if not texts:
        return ""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def _pop_defaults(kwargs: dict[str, object], keep: list[str] | tuple[str, ...] = ()) -> dict[str, object]:
    """Run-level sampling defaults (SGLang's run(temperature=..., max_new_tokens=..., ...)); a name
    that is also one of the program's own arguments (`keep`) stays an argument."""
    defaults = {k: kwargs.pop(k) for k in SAMPLING_KEYS if k in kwargs and k not in keep}
    if isinstance(defaults.get("stop"), str):
        defaults["stop"] = [defaults["stop"]]
    return {k: v for k, v in defaults.items() if v is not None}


def program(func: Callable[..., object]) -> Program:
    """Decorate `def f(s, ...)`: `s += ...` builds the prompt; gen/select call the model."""
    return Program(func)


def function(func: Callable[..., object] | None = None,
             num_api_spec_tokens: int | None = None) -> Program | Callable[[Callable[..., object]], Program]:
    """SGLang's spelling of `program`, bare or called (`@function(num_api_spec_tokens=...)`).

    num_api_spec_tokens (SGLang's speculative calls to chat-only APIs, a cost saving with the same
    texts) is accepted and not used: every gen here is its own request.
    """
    if func is not None:
        return Program(func)
    return Program
