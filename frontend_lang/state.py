"""ProgramState: the growing text of one program run, its variables, and its own executor.

`s += expr` queues `expr` on the state's single worker thread and returns at once, so forked
branches and batch items run concurrently and the engine batches their requests. Reading a
variable, the text or the messages waits for the queued work; an error inside the program
is raised there (and by `run`). Text is also recorded as a log of (variable, piece) events,
which `text_iter()` follows as it grows: all of it, or one generated variable.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from frontend_lang.backends.base import Backend, Prompt
from frontend_lang.chat_template import role_text
from frontend_lang.choices import decide
from frontend_lang.ir import Concat, Expr, Gen, RoleBegin, RoleBlock, RoleEnd, Select, SeparateReasoning
from frontend_lang.reasoning import reasoning_name, split_reasoning
from frontend_lang.typed_gen import typed_value


class ProgramState:
    def __init__(self, backend: Backend, defaults: dict[str, object] | None = None, stream: bool = False) -> None:
        self.backend = backend
        self.defaults = dict(defaults or {})
        self.stream = stream
        self._text = ""
        self._messages: list[dict[str, str]] = []
        self._vars: dict[str, object] = {}
        self._meta: dict[str, dict[str, object]] = {}
        self._role: tuple[str, int, bool] | None = None  # (role, content start, last part was a gen)
        self._error: BaseException | None = None
        self._futures: list[Future[None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixserve-program")
        # The event log text_iter readers follow: (variable or None, text piece); closed at the end.
        self._log: list[tuple[str | None, str]] = []
        self._log_changed = threading.Condition()
        self._log_closed = False
        self._lock = threading.Lock()
        self._forks: list[ProgramState] = []
        self._scopes: dict[str, int] = {}  # var_scope name -> where its text began

    # -- building ------------------------------------------------------------------------------------

    def __iadd__(self, expr: Expr) -> ProgramState:
        self._submit(self._run_expr, expr)
        return self

    def _submit(self, fn, *args) -> None:  # noqa: ANN001 - a bound method of this class
        def guarded() -> None:
            if self._error is None:
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - kept, raised on the next read
                    self.fail(exc)

        with self._lock:
            self._futures.append(self._executor.submit(guarded))

    @contextmanager
    def _role_block(self, role: str) -> Iterator[ProgramState]:
        self._submit(self._begin_role, role)
        yield self
        self._submit(self._end_role)

    def system(self) -> contextmanager:  # type: ignore[valid-type]
        return self._role_block("system")

    def user(self) -> contextmanager:  # type: ignore[valid-type]
        return self._role_block("user")

    def assistant(self) -> contextmanager:  # type: ignore[valid-type]
        return self._role_block("assistant")

    @contextmanager
    def var_scope(self, name: str) -> Iterator[ProgramState]:
        """`with s.var_scope("x"): s += ...`: s["x"] becomes the text appended inside the block."""
        self._submit(self._begin_scope, name)
        yield self
        self._submit(self._end_scope, name)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """A fork of one that joins back (its new variables gathered) when the block ends."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # -- reading -------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Wait for everything queued so far; raise the program's error, if any."""
        while True:
            with self._lock:
                pending = [f for f in self._futures if not f.done()]
            if not pending:
                break
            for future in pending:
                future.result()
        if self._error is not None:
            raise self._error

    def __getitem__(self, name: str) -> object:
        self.sync()
        if name not in self._vars:
            raise KeyError(f"no variable {name!r} in this program state (have: {sorted(self._vars)})")
        return self._vars[name]

    def get_var(self, name: str) -> object:
        return self[name]

    def set_var(self, name: str, value: object) -> None:
        self.sync()
        self._vars[name] = value

    __setitem__ = set_var

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._vars

    def get(self, name: str, default: object = None) -> object:
        self.sync()
        return self._vars.get(name, default)

    def get_meta_info(self, name: str) -> dict[str, object]:
        """What the backend reported for gen `name`: token counts, finish reason, logprobs when asked."""
        self.sync()
        if name not in self._meta:
            raise KeyError(f"no meta info for {name!r} (have: {sorted(self._meta)})")
        return self._meta[name]

    def text(self) -> str:
        self.sync()
        return self._text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self._messages]

    @property
    def error(self) -> BaseException | None:
        return self._error

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced, until the program ends: all of it, or only what gen `var_name` writes.

        With `run(..., stream=True)` pieces arrive token by token; otherwise each gen arrives whole.
        Any number of readers may follow the same state.
        """
        seen = 0
        while True:
            with self._log_changed:
                self._log_changed.wait_for(lambda: len(self._log) > seen or self._log_closed)
                pieces, closed = self._log[seen:], self._log_closed
            seen += len(pieces)
            for var, text in pieces:
                if var_name is None or var == var_name:
                    yield text
            if closed and seen == len(self._log):
                if self._error is not None:
                    raise self._error
                return

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for asyncio code: the waiting happens on a worker thread, not the event loop."""
        loop = asyncio.get_running_loop()
        pieces = self.text_iter(var_name)
        done = object()
        while (piece := await loop.run_in_executor(None, next, pieces, done)) is not done:
            yield piece  # type: ignore[misc]

    def fail(self, exc: BaseException) -> None:
        """Record the program's error; readers see it at their next read."""
        self._error = exc
        self._close_log()

    def _close_log(self) -> None:
        with self._log_changed:
            self._log_closed = True
            self._log_changed.notify_all()

    def fork(self, n: int) -> ForkGroup:
        """`n` states sharing this one's text; the shared trunk is computed (and cached) once, first."""
        self.sync()
        self.backend.warm(self._text)
        children = [self._copy() for _ in range(n)]
        self._forks.extend(children)
        return ForkGroup(children, self)

    def _copy(self) -> ProgramState:
        child = ProgramState(self.backend, self.defaults, self.stream)
        child._text, child._messages = self._text, copy.deepcopy(self._messages)
        child._vars, child._role = dict(self._vars), self._role
        return child

    def _join_text(self, forks: list[ProgramState]) -> None:
        base = self._text  # what every fork started from; each appends what it added
        for fork in forks:
            self._append(fork._text[len(base) :] if fork._text.startswith(base) else fork._text)

    def finish(self) -> None:
        """Mark the end of the program (for text_iter) once queued work is done, then let the
        worker threads (this state's and its forks') exit when their queued work is through."""
        self._submit(lambda: None)
        self._executor.submit(self._close_log)
        self._release_workers()

    def _release_workers(self) -> None:
        self._executor.shutdown(wait=False)  # queued work still runs; the thread then exits
        for child in self._forks:
            child._release_workers()

    def __repr__(self) -> str:
        return f"ProgramState(text={self._text[-80:]!r}, vars={sorted(self._vars)})"

    # -- executing (on the worker thread) --------------------------------------------------------------

    def _append(self, text: str, var: str | None = None) -> None:
        if text:
            self._text += text
            with self._log_changed:
                self._log.append((var, text))
                self._log_changed.notify_all()

    def _run_expr(self, expr: Expr) -> None:
        if isinstance(expr, str):
            self._append(expr)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, Concat):
            for part in expr.parts:
                self._run_expr(part)
        elif isinstance(expr, RoleBlock):
            self._begin_role(expr.role)
            for part in expr.parts:
                self._run_expr(part)
            self._end_role()
        elif isinstance(expr, RoleBegin):
            self._begin_role(expr.role)
        elif isinstance(expr, RoleEnd):
            if self._role is not None and self._role[0] != expr.role:
                raise ValueError(f"{expr.role}_end() inside a {self._role[0]} block")
            self._end_role()
        elif isinstance(expr, SeparateReasoning):
            self._separate_reasoning(expr)
        elif isinstance(expr, ProgramState):
            raise TypeError("cannot add a ProgramState to another; add its text() instead")
        else:
            self._append(str(expr))

    def _begin_scope(self, name: str) -> None:
        self._scopes[name] = len(self._text)

    def _end_scope(self, name: str) -> None:
        self._vars[name] = self._text[self._scopes.pop(name) :]

    def _begin_role(self, role: str) -> None:
        if self._role is not None:
            raise ValueError(f"a {role} block cannot start inside a {self._role[0]} block")
        render = self.backend.renderer()
        if render is None:
            prefix = f"{role}: "
        else:
            prefix = role_text(render, self._messages, self._text, role).prefix
        self._append(prefix)
        self._role = (role, len(self._text), False)

    def _end_role(self) -> None:
        if self._role is None:
            raise ValueError("a role block ended that never began")
        role, start, ended_with_gen = self._role
        content = self._text[start:]
        if ended_with_gen and content != content.rstrip():
            # The model's stop left whitespace the template would trim: drop it here too.
            content = content.rstrip()
            self._text = self._text[: start + len(content)]
        render = self.backend.renderer()
        if render is None:
            suffix = "\n"
        else:
            suffix = role_text(render, self._messages, self._text[:start], role).suffix
        self._role = None
        self._messages.append({"role": role, "content": content})
        self._append(suffix)

    def _prompt(self) -> Prompt:
        in_assistant = self._role is not None and self._role[0] == "assistant"
        return Prompt(self._text, list(self._messages), in_assistant)

    def _gen(self, gen: Gen) -> None:
        params = gen.sampling_params(self.defaults)
        prompt = self._prompt()
        if prompt.in_assistant and self.backend.chat_stop_strings:
            params["stop"] = list(params.get("stop") or []) + self.backend.chat_stop_strings  # type: ignore[arg-type]
        samples: list[str] = []
        if self.stream and params.get("n", 1) == 1:
            pieces = []
            for delta in self.backend.stream(prompt, params):
                pieces.append(delta)
                self._append(delta, gen.name)
            text, meta = "".join(pieces), {}
        else:
            completion = self.backend.generate(prompt, params)
            text, meta, samples = completion.text, completion.meta_info, completion.samples
            self._append(text, gen.name)
        if gen.name is not None:
            value: object = text
            if gen.dtype is not None:
                value = typed_value(gen.dtype, text)
            if len(samples) > 1:  # n > 1: every sample, as SGLang keeps them (the text has the first)
                value = [typed_value(gen.dtype, t) for t in samples] if gen.dtype is not None else samples
            self._vars[gen.name] = value
            self._meta[gen.name] = meta
        if self._role is not None:
            self._role = (self._role[0], self._role[1], True)

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        start = len(self._text)
        self._run_expr(expr.expr)  # type: ignore[arg-type]
        tail = self._text[start:]
        for name in _named_calls(expr.expr):
            raw = self._vars.get(name)
            if not isinstance(raw, str):
                continue
            reasoning, answer = split_reasoning(raw, expr.model_type)
            self._vars[name], self._vars[reasoning_name(name)] = answer, reasoning
            tail = tail.replace(raw, answer, 1)
        self._text = self._text[:start] + tail

    def _select(self, sel: Select) -> None:
        logprobs = self.backend.choice_logprobs(self._prompt(), sel.choices)
        unconditional = None
        if sel.choices_method == "unconditional_likelihood_normalized":
            unconditional = self.backend.unconditional_logprobs(sel.choices)
        index, scores = decide(sel.choices_method, logprobs, unconditional)
        choice = sel.choices[index]
        self._append(choice, sel.name)
        if sel.name is not None:
            self._vars[sel.name] = choice
            self._vars[f"{sel.name}_scores"] = scores
            self._meta[sel.name] = {"normalized_prompt_logprobs": scores, "input_token_logprobs": logprobs}
        if self._role is not None:
            self._role = (self._role[0], self._role[1], False)


def _named_calls(expr: object) -> list[str]:
    """The variable names of the gens and selects in an expression, in order."""
    if isinstance(expr, (Gen, Select)):
        return [expr.name] if expr.name is not None else []
    parts = expr.parts if isinstance(expr, (Concat, RoleBlock)) else []
    return [name for part in parts for name in _named_calls(part)]


class ForkGroup(list):
    """The states `s.fork(n)` returns, as SGLang's ProgramStateGroup: a list of forks that also
    broadcasts `+=` and joins back into the parent."""

    def __init__(self, forks: list[ProgramState], parent: ProgramState) -> None:
        super().__init__(forks)
        self.parent = parent

    def __iadd__(self, other: object) -> ForkGroup:  # type: ignore[override,misc]
        """An expression goes to every fork; a callable gets each fork's index; a list gives one each."""
        if isinstance(other, (list, tuple)):
            if len(other) != len(self):
                raise ValueError(f"{len(other)} expressions for {len(self)} forks")
            items = list(other)
        elif callable(other) and not isinstance(other, Expr):
            items = [other(i) for i in range(len(self))]
        else:
            items = [other] * len(self)
        for fork, item in zip(self, items):
            fork += item
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable the forks made becomes a list in the parent (one value per
        fork). concate_and_append: the forks' new text is appended to the parent's, in order."""
        for fork in self:
            fork.sync()
        parent = self.parent
        if mode == "gather_variable":
            parent.sync()
            had = set(parent._vars)  # forks start with the parent's variables: only new ones gather
            for fork in self:
                for name, value in fork._vars.items():
                    if name not in had:
                        parent._vars.setdefault(name, []).append(value)  # type: ignore[union-attr]
        elif mode == "concate_and_append":
            parent._submit(parent._join_text, list(self))
            parent.sync()
        else:
            raise ValueError(f"join mode must be gather_variable or concate_and_append, got {mode!r}")
