"""The Engine: what users call. Tokenizes, validates, submits to the engine loop, and waits or streams.

    with Engine(model="default") as engine:
        out = engine.generate(["Q: What is the capital of France?\\nA:"],
                              sampling_params={"max_new_tokens": 8, "temperature": 0})
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from radix.tree_view import DEFAULT_LIMIT, cache_snapshot, check_page
from runtime.cpu import serial_on_this_thread
from runtime.engine_args import EngineArgs
from runtime.engine_info import EngineInfo
from runtime.exec.model_runner import ModelRunner, RunnerConfig, load_config
from runtime.loading.sources import resolve_model_path
from runtime.lora import AdapterIdentity, LoraRegistry
from runtime.lora.namespace import cache_key
from runtime.output import Output
from runtime.sampling.jump_forward import JumpForward
from runtime.sampling.pooling import PoolingParams
from runtime.sampling_params import SamplingParams
from runtime.step.loop import EngineLoop
from runtime.step.request import Req
from runtime.step.schedule_policy import SchedulePolicy
from runtime.step.scheduler import Scheduler
from runtime.step.timing import StepTimings
from runtime.text.detokenizer import IncrementalDetokenizer
from runtime.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from runtime.sampling.grammar import Grammars

logger = logging.getLogger(__name__)
ParamsLike = SamplingParams | dict | None
Sink = Callable[[Output], None]


class QueueFullError(RuntimeError):
    """The waiting queue is at `max_queued_requests`; try again later."""


class Engine:
    def __init__(self, args: EngineArgs | None = None, **kwargs: object) -> None:
        self.args = args if args is not None else EngineArgs(**kwargs)  # type: ignore[arg-type]
        self.args.validate()
        if self.args.num_threads:
            torch.set_num_threads(self.args.num_threads)
        self.model_path = resolve_model_path(self.args.model, self.args.gguf_file)
        config = load_config(self.model_path)
        self.model_config = config
        self.tokenizer = Tokenizer(self.model_path, getattr(config, "model_type", ""))
        with serial_on_this_thread():  # the engine thread's OpenMP pool stays the only one
            self._build(config)
        self.loop = EngineLoop(self.runner, self.tokenizer, self.scheduler, self.kv, self.context_len,
                               overlap=self.args.overlap_on(self.device.type), grammar_fill=self._fill_grammar,
                               narrow_max=self.args.narrow_logits_max_tokens)
        self.loop.ready.wait()  # warmed up on its own thread before the first request (EngineLoop._run)
        self.info = self._describe()
        # New requests not yet admitted, counted at once (the loop's stats lag a step behind).
        self._queued = 0
        self._queue_lock = threading.Lock()
        self._grammars = None  # runtime.sampling.grammar.Grammars, built on the first constrained request
        self._grammars_lock = threading.Lock()
        self.scheduler.on_dequeue = self._dequeued
        self._seeds = itertools.count(self.args.seed * 1_000_003)
        self._arrivals = itertools.count()
        self._closed = False

    def _build(self, config: object) -> None:
        """The model runner (weights, the KV state, CUDA graphs) and the scheduler."""
        a = self.args
        self.runner = ModelRunner(RunnerConfig(
            self.model_path, dtype=a.dtype, num_slots=a.kv_cache_tokens, max_requests=a.max_running_requests,
            max_context=a.context_length, attention_backend=a.attention_backend, device=a.device,
            load_format=a.load_format, page_size=a.page_size, kv_cache_memory_fraction=a.kv_cache_memory_fraction,
            max_kv_cache_tokens=a.max_kv_cache_tokens,
            cuda_graph_max_bs=None if a.disable_cuda_graph else a.cuda_graph_max_bs, quantization=a.quantization,
            prefix_cache=a.enable_prefix_cache, kv_host_tier_tokens=a.kv_host_tier_tokens or 0,
            kv_host_tier_gib=a.kv_host_tier_gib, kv_disk_dir=a.kv_disk_dir, kv_disk_gib=a.kv_disk_gib,
            kv_host_tier_dtype=a.kv_host_tier_dtype, kv_tier_copy=a.kv_tier_copy, cpu_threads=a.num_threads,
            adapt_cpu_threads=a.adapt_cpu_threads, enable_lora=a.lora_on, int8_activations=a.int8_activations,
            exact_activations=a.exact_activations),
            config)
        self.device = self.runner.device
        self.context_len = self.runner.context_len
        self.kv = self.runner.kv  # the KV state's one owner, handed to the scheduler and the loop
        self.allocator, self.cache = self.kv.allocator, self.kv.cache  # read by stats and slot checks
        policy = SchedulePolicy(a.schedule_policy, self.kv.cache, a.lpm_fallback_queue_len, a.page_size)
        jump_forward = None if a.disable_jump_forward else JumpForward.for_tokenizer(self.tokenizer.hf)
        self.scheduler = Scheduler(a, self.kv, policy, jump_forward)
        # LoRA adapters (runtime/lora/): None unless --enable-lora or --lora-paths
        self.lora: LoraRegistry | None = None
        if self.runner.lora_targets is not None:
            self.lora = LoraRegistry(self.runner.lora_targets, self.runner.dtype, self.device, a.max_loaded_loras)
            for name, path in a.lora_adapters().items():
                self.lora.load(name, path)

    # -- submitting ---------------------------------------------------------------------------------

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt must not be empty or only whitespace")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def submit(self, input_ids: Sequence[int], sampling_params: ParamsLike = None, sink: Sink | None = None,
               rid: str | None = None, cache_salt: str | None = None, stream: bool = False,
               pooling: PoolingParams | None = None, lora: str | None = None) -> list[str]:
        """Queue one prompt (n samples of it); each sample's Outputs go to `sink` on the engine thread.
        With `pooling`, the prompt returns an embedding or chosen logits instead of tokens
        (runtime/sampling/pooling.py; its sampling parameters must ask for no new tokens). With `lora`,
        through that loaded adapter (runtime/lora/), its prefixes cached apart from every other's.

        Returns the request ids, one per sample. Raises ValueError for bad input.
        """
        if self._closed:
            raise RuntimeError("the engine has been shut down")
        params = _as_params(sampling_params)
        ids = self._validate_ids(input_ids)
        if pooling is not None:
            pooling.validate(self.runner.vocab_size)
            if params.max_new_tokens != 0 or params.n != 1:
                raise ValueError("a pooling request generates nothing: max_new_tokens must be 0 and n 1")
        if params.logit_bias and max(params.logit_bias) >= self.runner.vocab_size:
            raise ValueError(f"logit_bias: token id {max(params.logit_bias)} is not in [0, {self.runner.vocab_size})")
        compiled = self._compile_constraint(params)  # a bad constraint raises before anything is queued
        if lora is not None and self.lora is None:
            raise ValueError(f"lora_path: {lora!r} names an adapter, and this engine serves none (--enable-lora)")
        with self._queue_lock:
            limit = self.args.max_queued_requests
            if limit is not None and self._queued + params.n > limit:
                raise QueueFullError(f"the waiting queue is full ({limit} requests)")
            self._queued += params.n
        params = replace(params, max_new_tokens=min(params.max_new_tokens, self.context_len - len(ids)))
        rid = rid or uuid.uuid4().hex
        rids = [rid] if params.n == 1 else [f"{rid}.{i}" for i in range(params.n)]
        try:  # each sample holds the adapter until it ends (the loop releases it)
            adapters = [self.lora.acquire(lora) for _ in rids] if lora is not None and self.lora else [None] * len(rids)
        except (LookupError, ValueError, RuntimeError):  # unknown, changed on disk, or no room (AdapterBusy)
            with self._queue_lock:
                self._queued -= params.n
            raise
        for index, (child, adapter) in enumerate(zip(rids, adapters)):
            req = self._make_req(child, ids, params, index, sink or (lambda _: None), cache_salt, stream)
            if adapter is not None:
                req.lora, req.extra_key = adapter, cache_key(cache_salt, adapter.identity)
            req.pooling = pooling
            if compiled is not None:
                req.grammar = self._grammars.matcher(compiled)  # each sample walks the grammar on its own
            self.loop.post(lambda req=req: self.loop.add_request(req))
        return rids

    def load_lora_adapter(self, name: str, path: str) -> AdapterIdentity:
        """Load a PEFT adapter under `name` (ValueError: bad files, a name in use, no room)."""
        return self._lora_registry().load(name, path)

    def unload_lora_adapter(self, name: str) -> AdapterIdentity:
        """Stop serving `name` (AdapterNotFound if unknown); requests already running keep it to their end."""
        return self._lora_registry().unload(name)

    def _lora_registry(self) -> LoraRegistry:
        if self.lora is None:
            raise ValueError("LoRA adapters are off: start with --enable-lora (or --lora-paths)")
        return self.lora

    def _compile_constraint(self, params: SamplingParams) -> object | None:
        """Compile the request's regex / JSON schema / EBNF here, on the caller's thread (cached by source)."""
        constraint = params.constraint()
        if constraint is None:
            return None
        return self.grammars.compile(*constraint, skip_special_tokens=params.skip_special_tokens)

    @property
    def grammars(self) -> Grammars:
        """The grammar compiler for this engine's vocabulary (runtime/sampling/grammar.py): built on first
        use, since reading the tokenizer into xgrammar takes a moment."""
        with self._grammars_lock:
            if self._grammars is None:
                from runtime.sampling.grammar import Grammars

                stops = sorted(self.tokenizer.eos_token_ids)
                self._grammars = Grammars(self.tokenizer.hf, self.runner.vocab_size, stops)
            return self._grammars

    @property
    def queued(self) -> int:
        """Requests submitted and not yet admitted (counted at once; stats() lags a step behind)."""
        with self._queue_lock:
            return self._queued

    def _fill_grammar(self, matchers: list) -> torch.Tensor:
        """On the loop thread: a request has a matcher only once its constraint compiled, so
        `_grammars` exists by then."""
        assert self._grammars is not None
        return self._grammars.fill(matchers)

    def _describe(self) -> EngineInfo:
        runner = self.runner
        return EngineInfo(
            model_path=str(self.model_path), device=str(self.device), dtype=str(runner.dtype).removeprefix("torch."),
            dtype_choice=runner.precision.reason, quantization=runner.quantization,
            attention_backend=runner.backend.name,
            cuda_graph_batch_sizes=list(runner.graphs.sizes) if runner.graphs else [],
            overlap_schedule_on=self.loop.overlap, kv_cache_tokens=runner.num_slots, page_size=self.args.page_size,
            context_length=self.context_len, vocab_size=runner.vocab_size, cpu_threads=runner.cpu_thread_ceiling,
            adapt_cpu_threads=runner.threads is not None)

    def _dequeued(self, req: Req) -> None:
        with self._queue_lock:
            self._queued -= 1

    def check_token_ids(self, input_ids: Sequence[int]) -> list[int]:
        """`input_ids` as a list, or a ValueError naming the first that is not a token id of this
        model (what a server checks before it decodes a prompt given as ids, e.g. to echo it)."""
        ids = list(input_ids)
        vocab = self.runner.vocab_size
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise ValueError(f"input_ids: token id {token!r} is not in [0, {vocab})")
        return ids

    def _validate_ids(self, input_ids: Sequence[int]) -> list[int]:
        ids = self.check_token_ids(input_ids)
        if not ids:
            raise ValueError("input_ids must not be empty")
        if len(ids) >= self.context_len:
            raise ValueError(f"input_ids: the prompt has {len(ids)} tokens; this model's context length is {self.context_len} "
                             "(prompt plus at least one generated token)")
        return ids

    def _make_req(self, rid: str, ids: list[int], params: SamplingParams, index: int, sink: Sink,
                  cache_salt: str | None, stream: bool) -> Req:
        seed = params.seed + index if params.seed is not None else next(self._seeds)
        detok = IncrementalDetokenizer(self.tokenizer, ids, list(params.stop), params.skip_special_tokens,
                                       list(params.stop_regex), params.no_stop_trim)
        return Req(rid=rid, prompt_ids=ids, params=params, detok=detok, sink=sink, seed=seed % 2**63,
                   extra_key=cache_salt, index=index, arrival=next(self._arrivals), stream=stream)

    # -- the user API -------------------------------------------------------------------------------

    def generate(self, prompts: str | Sequence[str] | None = None,
                 input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 sampling_params: ParamsLike | Sequence[ParamsLike] = None,
                 cache_salt: str | None = None, lora: str | None = None) -> list[Output]:
        """Run a batch to completion. With n > 1, a prompt's n samples follow each other in the result."""
        batch = self._prompt_batch(prompts, input_ids)
        params = _per_prompt(sampling_params, len(batch))
        encoded = [self.encode(p) for p in batch]
        waiter = _Waiter()
        keys: list[str] = []
        for ids, p in zip(encoded, params):
            keys.extend(self.submit(ids, p, waiter.sink, cache_salt=cache_salt, lora=lora))
        waiter.expect(keys)
        return waiter.wait(keys, self.loop)

    def embed(self, prompts: str | Sequence[str] | None = None,
              input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None, pooling: str | None = None,
              normalize: bool = True, cache_salt: str | None = None) -> list[Output]:
        """Embeddings of a batch of texts (`Output.embedding`): the final hidden state at the last token
        (`pooling="last"`, the default `--embedding-pooling`) or the mean over the prompt, L2-normalised.
        The prompts share the radix cache with every other request."""
        how = PoolingParams("embed", pooling or self.args.embedding_pooling, normalize)
        return self._pooled(prompts, input_ids, how, cache_salt)

    def score_next_tokens(self, prompts: str | Sequence[str] | None = None,
                          input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                          token_ids: Sequence[int] = (), cache_salt: str | None = None) -> list[Output]:
        """The logits of `token_ids` at the position after each prompt (`Output.token_logits`), with
        no token generated: a decoder reranker's yes/no scores."""
        return self._pooled(prompts, input_ids, PoolingParams("next_token", token_ids=list(token_ids)), cache_salt)

    def _pooled(self, prompts: str | Sequence[str] | None, input_ids: Sequence[int] | Sequence[Sequence[int]] | None,
                pooling: PoolingParams, cache_salt: str | None) -> list[Output]:
        encoded = [self.encode(p) for p in self._prompt_batch(prompts, input_ids)]
        waiter = _Waiter()
        keys: list[str] = []
        for ids in encoded:
            keys.extend(self.submit(ids, SamplingParams(max_new_tokens=0), waiter.sink, cache_salt=cache_salt,
                                    pooling=pooling))
        waiter.expect(keys)
        return waiter.wait(keys, self.loop)

    async def stream(self, prompt: str | None = None, input_ids: Sequence[int] | None = None,
                     sampling_params: ParamsLike = None, rid: str | None = None,
                     cache_salt: str | None = None, lora: str | None = None) -> AsyncIterator[Output]:
        """Yield Outputs as tokens arrive (`delta_text` is the new text); the last one is finished.

        Leaving the iterator early aborts the request and frees its KV.
        """
        params = _as_params(sampling_params)
        if params.n != 1:
            raise ValueError("n: stream() takes one sample; use generate() or submit() for n > 1")
        ids = self.encode(prompt if prompt is not None else input_ids or [])
        async with aclosing(self.outputs(ids, params, rid=rid, cache_salt=cache_salt, stream=True, lora=lora)) as outputs:
            async for out in outputs:
                yield out

    async def outputs(self, input_ids: Sequence[int], sampling_params: ParamsLike = None, rid: str | None = None,
                      cache_salt: str | None = None, stream: bool = False,
                      pooling: PoolingParams | None = None, lora: str | None = None) -> AsyncIterator[Output]:
        """Submit one prompt (n samples) and yield its Outputs on the caller's event loop as they
        arrive; with `stream`, one per new token too. Submission errors raise at the first step.
        Leaving early (closing the iterator: a client gone) aborts every sample still running,
        so their KV comes back. Engine.stream and the HTTP server both go through here."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Output] = asyncio.Queue()
        rids = self.submit(input_ids, sampling_params, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out),
                           rid=rid, cache_salt=cache_salt, stream=stream, pooling=pooling, lora=lora)
        remaining = len(rids)
        try:
            while remaining:
                out = await queue.get()
                if out.finished:
                    remaining -= 1
                yield out
        finally:
            if remaining:
                for child in rids:
                    self.abort(child)

    def abort(self, rid: str) -> None:
        """Abort a request (with n > 1, all its samples); unknown or finished ids are ignored."""
        self.loop.post(lambda: self.loop.abort(rid))

    def pin_prefix(self, key: str, token_ids: Sequence[int], ttl_s: float, cache_salt: str | None = None,
                   priority: int = 0, lora: str | None = None) -> None:
        """Retain the cached prefix of `token_ids` (a finished conversation, a prompt that asked for
        retention) for `ttl_s` seconds, under `key` (pinning a key again replaces its pin): evicted
        last, lower `priority` first; with `lora`, the prefix that adapter cached (no pin if it is
        no longer loaded). Bounded: runtime/kv/pins.py."""
        ids = list(token_ids)
        identity = self.lora.identity(lora) if lora is not None and self.lora is not None else None
        if lora is not None and identity is None:
            return
        namespace = cache_key(cache_salt, identity)
        self.loop.post(lambda: self.kv.pins.pin(key, ids, ttl_s, namespace, priority))

    def unpin_prefix(self, key: str) -> None:
        self.loop.post(lambda: self.kv.pins.unpin(key))

    def cache_snapshot(self, offset: int = 0, limit: int = DEFAULT_LIMIT) -> dict[str, object]:
        """One page of the prefix cache's tree, read on the engine thread (radix/tree_view.py), with
        the pool's fill and the retained prefixes' share. ValueError names a bad offset or limit."""
        check_page(offset, limit)
        result: list[dict[str, object]] = []
        done = threading.Event()

        def run() -> None:
            try:
                kv, pins = self.kv, self.kv.pins
                pins.expire()  # a retention whose time is up is not shown
                tiers, capacities = kv.tiers, {"device": kv.allocator.num_slots}
                if tiers is not None and tiers.config.host_tokens:
                    capacities["host"] = tiers.config.host_tokens
                page = cache_snapshot(kv.cache, offset, limit, retained=pins.retained(), capacities=capacities,
                                      tier_of=tiers.tier_of if tiers is not None else None,
                                      tier_retained=tiers.retained_until if tiers is not None else None)
                if tiers is not None and tiers.folder is not None:  # the disk tier's fill is in bytes
                    disk = page["tiers"].setdefault("disk", {"nodes": 0, "tokens": 0, "capacity": 0})
                    disk.update(bytes=tiers.disk_bytes(), capacity_bytes=tiers.config.disk_bytes)
                page["retention"] = pins.summary()
                page["pool"] = {key: self.loop.stats()[f"slots_{key}"] for key in ("free", "cached", "in_use", "total")}
                result.append(page)
            finally:
                done.set()

        self.loop.post(run)
        if not done.wait(timeout=60) or not result:
            raise RuntimeError("the engine loop did not answer the cache snapshot")
        return result[0]

    def flush_cache(self) -> bool:
        result: list[bool] = []
        done = threading.Event()

        def run() -> None:
            result.append(self.loop.flush_cache())
            done.set()

        self.loop.post(run)
        done.wait(timeout=60)
        return bool(result and result[0])

    def stats(self) -> dict[str, float]:
        stats = self.loop.stats()
        if self.lora is not None:  # LoRA adapters (runtime/lora/registry.py)
            stats.update(lora_adapters=len(self.lora.names()), lora_adapters_held=self.lora.held_count(),
                         lora_reads_total=self.lora.loads, lora_dropped_total=self.lora.evictions)
        return stats

    @property
    def healthy(self) -> bool:
        return self.loop.alive

    @contextmanager
    def time_steps(self) -> Iterator[StepTimings]:
        """Record where the loop's time goes while the block runs (benchmarks: runtime/step/timing.py).
        Requests submitted inside the block are timed from their first step."""
        timings = StepTimings(self.device)
        self.loop.post(lambda: self.loop.set_timings(timings))
        try:
            yield timings
        finally:
            self.loop.post(lambda: self.loop.set_timings(None))

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.loop.stop()
            self.kv.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _prompt_batch(self, prompts: str | Sequence[str] | None,
                      input_ids: Sequence[int] | Sequence[Sequence[int]] | None) -> list[str | list[int]]:
        if (prompts is None) == (input_ids is None):
            raise ValueError("give exactly one of prompts or input_ids")
        if prompts is not None:
            return [prompts] if isinstance(prompts, str) else list(prompts)
        assert input_ids is not None
        if input_ids and isinstance(input_ids[0], int):
            return [list(input_ids)]  # type: ignore[arg-type]
        return [list(x) for x in input_ids]  # type: ignore[union-attr]


class _Waiter:
    """Collects the final Output of each request id; wakes the caller when all are in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._results: dict[str, Output] = {}
        self._expected: set[str] | None = None

    def sink(self, out: Output) -> None:
        if out.finished:
            with self._lock:
                self._results[out.rid] = out
                if self._expected is not None and self._expected <= self._results.keys():
                    self._done.set()

    def expect(self, keys: list[str]) -> None:
        with self._lock:
            self._expected = set(keys)
            if self._expected <= self._results.keys():
                self._done.set()

    def wait(self, keys: list[str], loop: EngineLoop) -> list[Output]:
        while not self._done.wait(timeout=0.5):
            if loop.dead is not None:
                raise RuntimeError(f"the engine loop died: {loop.dead!r}")
        return [self._results[k] for k in keys]


def _as_params(params: ParamsLike) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        params.validate()
        return params
    if isinstance(params, dict):
        return SamplingParams.from_dict(params)
    raise ValueError(f"sampling_params must be a SamplingParams or a dict, got {type(params).__name__}")


def _per_prompt(params: ParamsLike | Sequence[ParamsLike], count: int) -> list[ParamsLike]:
    if isinstance(params, (list, tuple)):
        if len(params) != count:
            raise ValueError(f"sampling_params: {len(params)} given for {count} prompts")
        return list(params)
    return [params] * count  # type: ignore[list-item]
