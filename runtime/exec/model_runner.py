"""The model runner: loads a checkpoint onto the device, sizes and owns the KV pool, runs one ForwardBatch."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kernels import get_attention_backend
from kernels.cpu_ops import ops as cpu_ops
from runtime import cpu
from runtime.cpu import resolve_precision
from runtime.exec.context import ForwardContext, forward_context
from runtime.exec.device import DTYPES, resolve_device, resolve_dtype  # noqa: F401 - re-exported
from runtime.exec.graph_runner import DecodeGraphRunner
from runtime.exec.step_logits import StepLogits, weight_rows_of
from runtime.kv import KVManager, KVPool, KVShape, ReqSlotTable, build_kv, context_length, plan_kv_tokens
from runtime.kv.host_codec import HostCodec
from runtime.kv.tiers import TierConfig, kv_digest
from runtime.layers.output_layer import OutputLayer
from runtime.lora.adapter import Target
from runtime.lora.apply import LoraBatch, find_targets, wrap_targets
from runtime.loading.gguf_groups import read_int4_groups
from runtime.models import model_class, unreadable_config
from runtime.loading.kept_groups import KeptGroups
from runtime.loading.transformers_import import skip_hub_kernels_probe
from runtime.models.weights import dummy_init, iterate_weights, tensor_reader
from runtime.step.contract import BatchEntry
from runtime.step.forward_batch import ForwardBatch, HostBatch

logger = logging.getLogger(__name__)
GiB = 2**30


def load_config(folder: Path) -> object:
    skip_hub_kernels_probe()
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder))
    except ValueError as error:  # e.g. a model_type transformers does not know: name it and what we serve
        raise unreadable_config(folder, error) from error


def load_model(folder: Path, config: object, dtype: torch.dtype, device: torch.device,
               load_format: str = "auto", blocks: bool = False, int8_activations: bool = False,
               halves: bool = False) -> nn.Module:
    """Our model class for `config`, with weights from `folder` (or random ones: load_format="dummy").
    `blocks`: the weights a GGUF ships quantized are served from their codes (runtime/cpu/
    block_linear.py), never held in `dtype`: the model takes about the file's size.
    `int8_activations` (with `blocks`): its Q4_K and Q6_K layers sum activations rounded to int8
    (block_linear.round_activations_to_int8), their layouts kept in the block cache as served.
    `halves` (with `blocks`; the AVX2 default): its Q6_K layers round the activations to 15 bits in
    two int8 halves for the int8 loops (block_linear.halve_activations), their codes at six bits as
    with `int8_activations`, whose block cache file they share."""
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config)
    served: frozenset[str] = frozenset()
    if blocks:
        from runtime.cpu.block_cache import BlockStore
        from runtime.cpu.block_linear import swap_in_blocks

        output_name = "model.embed_tokens.weight" if getattr(model, "lm_head", None) is None else "lm_head.weight"
        # the layers as the first start built them (runtime/cpu/block_cache.py)
        store = BlockStore(folder, dtype, int8_activations or halves)
        served = frozenset(swap_in_blocks(model, KeptGroups(folder), tensor_reader(folder), dtype, output_name, store))
        if int8_activations:
            from runtime.cpu.block_linear import round_activations_to_int8

            logger.info("gguf: %d Q4_K and Q6_K layers sum int8 activations (--int8-activations)",
                        round_activations_to_int8(model))
        elif halves:
            from runtime.cpu.block_linear import halve_activations

            logger.info("gguf: %d Q6_K layers sum 15-bit activations in two int8 halves", halve_activations(model))
        store.finish()
    model.to_empty(device=device)
    model.to(dtype)
    if load_format == "dummy":
        logger.warning("load_format=dummy: RANDOM weights for %s (benchmarking shapes only; outputs are noise)",
                       folder)
        dummy_init(model)
    else:
        model.load_weights(iterate_weights(folder, exclude=served))
    model.eval().requires_grad_(False)
    return model


@dataclass
class RunnerConfig:
    model_path: Path
    dtype: str = "auto"
    num_slots: int | None = 4096  # None: size the pool from free memory (runtime/kv/pool.py: plan_kv_tokens)
    max_requests: int = 64
    max_context: int | None = 4096  # None: the model's own (runtime/kv/build.py: context_length)
    attention_backend: str = "auto"
    device: str = "cpu"
    load_format: str = "auto"
    page_size: int = 1
    kv_cache_memory_fraction: float | None = None
    max_kv_cache_tokens: int | None = None
    cuda_graph_max_bs: int | None = None  # capture decode graphs up to this batch size (CUDA only)
    quantization: str | None = None  # int8, int4, gguf or none; unset: runtime/cpu/prepare.py resolve_quantization
    prefix_cache: bool = True  # share KV of common prefixes (else a cache that keeps nothing)
    kv_host_tier_tokens: int = 0  # the prefix cache's host tier (runtime/kv/tiers.py); 0: none
    kv_host_tier_gib: float | None = None  # the same, in GiB of KV (either one)
    kv_disk_dir: str | None = None  # the prefix cache's disk tier; None: none
    kv_disk_gib: float = 4.0
    kv_host_tier_dtype: str = "auto"  # how host copies hold KV (runtime/kv/host_codec.py)
    kv_tier_copy: str = "auto"  # how KV moves to and from host copies (runtime/kv/tier_copy.py)
    cpu_threads: int | None = None  # the CPU threads' ceiling; None: the cores this process may use
    adapt_cpu_threads: bool = True  # fewer threads while other processes hold cores (runtime/cpu/thread_budget.py)
    enable_lora: bool = False  # LoRA adapters around the projections (runtime/lora/apply.py)
    int8_activations: bool = False  # a GGUF's Q4_K and Q6_K layers sum activations rounded to int8 (block_linear.py)
    exact_activations: bool = False  # no int16 rounding of the group kernels' activations (block_weights.py)


class ModelRunner:
    def __init__(self, cfg: RunnerConfig, config: object | None = None) -> None:
        start = time.perf_counter()
        self.config = config if config is not None else load_config(cfg.model_path)
        self.device = resolve_device(cfg.device)
        self.precision = resolve_precision(cfg.dtype, self.device, int(getattr(self.config, "hidden_size", 640)))
        self.dtype = self.precision.dtype
        # what --quantization means here (unset: a GGUF's own quantized weights where the CPU can serve them)
        self.quantization = cpu.resolve_quantization(cfg.quantization, self.device, self.dtype, cfg.model_path,
                                                     cfg.load_format)
        # gguf: the file's quantized weights served from their codes, with no copy in --dtype
        self.model = load_model(cfg.model_path, self.config, self.dtype, self.device, cfg.load_format,
                                blocks=self.quantization == "gguf", int8_activations=cfg.int8_activations,
                                halves=self.quantization == "gguf" and not cfg.int8_activations
                                and not cfg.exact_activations and cpu.int16_activations_default())
        if cfg.exact_activations and self.quantization == "gguf":
            from runtime.cpu.block_linear import keep_activations_exact

            keep_activations_exact(self.model)
        # What adapters may adapt, noted before cpu.prepare swaps layers (a GGUF's block layers are in
        # place already; find_targets reads any kind); wrapped below, around whatever kind is there then.
        self.lora_targets: dict[str, Target] | None = find_targets(self.model) if cfg.enable_lora else None
        # The CPU's own linear layers and output layer (runtime/cpu/); elsewhere plain ones.
        if self.device.type == "cpu":
            # int4 over a GGUF's own 4-bit codes where it has them (never over dummy weights)
            real = cfg.load_format != "dummy"
            int4 = read_int4_groups(cfg.model_path) if real and self.quantization == "int4" else None
            self.output_layer: OutputLayer = cpu.prepare(self.model, self.precision, self.quantization, int4)
            cpu_ops()  # the fused kernels loaded (or built) now, not inside the first request's step
        else:
            self.output_layer = OutputLayer()
        if self.lora_targets is not None:
            wrap_targets(self.model, self.lora_targets)
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            m.nbytes() for m in self.model.modules() if hasattr(m, "nbytes") and isinstance(m, nn.Module))
        self.vocab_size: int = self.config.vocab_size
        c = self.config
        shape = KVShape.of(c, self.dtype, self.device)
        num_slots = plan_kv_tokens(self.device, shape.bytes_per_token, cfg.page_size, cfg.num_slots,
                                   cfg.kv_cache_memory_fraction, cfg.max_kv_cache_tokens)
        self.context_len = context_length(cfg.max_context, c, num_slots)
        # The KV state's one owner; the runner reads its pool and table, the scheduler asks it.
        self.kv: KVManager = build_kv(shape, num_slots, cfg.page_size, cfg.max_requests, self.context_len,
                                      cfg.prefix_cache, self._tier_config(cfg, shape))
        self.backend = get_attention_backend(cfg.attention_backend, self.device.type)
        self.softcap: float | None = getattr(c, "final_logit_softcapping", None)
        # A constrained row's logits at its allowed ids only (runtime/exec/step_logits.py): on the CPU,
        # where the output layer is most of a small model's step; a GPU computes whole rows.
        self._weight_rows = weight_rows_of(self.model.output_weight) if self.device.type == "cpu" else None
        self._logit_width = int(self.model.output_weight.shape[0])
        self.graphs: DecodeGraphRunner | None = None
        self._cpu_threads = (cfg.cpu_threads, cfg.adapt_cpu_threads)
        self.threads: cpu.ThreadGovernor | None = None  # set on the engine thread (warm_up)
        self.cpu_thread_ceiling: int | None = None
        # a model whose step reads data-dependent sizes on the host (the MoE expert loop) runs eagerly
        if self.device.type == "cuda" and cfg.cuda_graph_max_bs and getattr(self.model, "cuda_graphs", True):
            self.graphs = self._capture(min(cfg.cuda_graph_max_bs, cfg.max_requests))
        logger.info("loaded %s on %s (%s, %s attention) in %.1fs: weights %.2f GiB, KV pool %.2f GiB = %d tokens",
                    cfg.model_path.name, self.device, str(self.dtype).removeprefix("torch."), self.backend.name,
                    time.perf_counter() - start, weights / GiB, self.pool.nbytes() / GiB, num_slots)

    def _tier_config(self, cfg: RunnerConfig, shape: KVShape) -> TierConfig | None:
        codec = HostCodec(cfg.kv_host_tier_dtype, self.dtype)
        host = cfg.kv_host_tier_tokens
        if cfg.kv_host_tier_gib:  # compact copies: more tokens in the same GiB
            per_token = codec.bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim)
            host = max(host, int(cfg.kv_host_tier_gib * GiB) // per_token)
        if not host and not cfg.kv_disk_dir:
            return None
        digest = kv_digest(cfg.model_path, self.dtype, cfg.page_size, cfg.load_format,
                           codec.name) if cfg.kv_disk_dir else ""
        return TierConfig(host_tokens=host, disk_dir=Path(cfg.kv_disk_dir) if cfg.kv_disk_dir else None,
                          disk_bytes=int(cfg.kv_disk_gib * GiB), digest=digest, host_dtype=cfg.kv_host_tier_dtype,
                          copy_engine=cfg.kv_tier_copy)

    def _capture(self, max_bs: int) -> DecodeGraphRunner | None:
        try:
            return DecodeGraphRunner(self, max_bs)
        except Exception as exc:  # noqa: BLE001 - serving eagerly beats not serving
            logger.warning("CUDA graphs are off (decode runs eagerly): %s", exc)
            return None

    def warm_up(self, max_requests: int) -> None:
        """Before the first step, on the thread that will run the steps: the CPU output layer times
        its ways for the batch sizes it will meet (runtime/cpu/output_layer.py). The CPU's thread count
        is set here too, on the thread whose OpenMP pool computes (runtime/cpu/thread_budget.py), and
        the block kernels' prefetch line is timed with it (runtime/cpu/weight_prefetch.py)."""
        if self.device.type == "cpu":
            requested, adapt = self._cpu_threads
            self.threads = cpu.ThreadGovernor.for_this_process(requested, adapt)
            self.cpu_thread_ceiling = torch.get_num_threads() if self.threads is None else self.threads.ceiling
            cpu.choose_weight_prefetch(self.model, self.dtype)
        warm = getattr(self.output_layer, "warm_up", None)
        if warm is not None:
            with torch.inference_mode():
                warm(self.model.output_weight, max_requests)

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def pool(self) -> KVPool:
        return self.kv.pool

    @property
    def table(self) -> ReqSlotTable:
        return self.kv.table

    def run(self, entries: list[BatchEntry],
            future_ids: torch.Tensor | None = None) -> tuple[StepLogits, HostBatch, torch.Tensor | None]:
        """Logits for a step's entries (kernel order), the step's layout, and every new token's final
        hidden state where an entry asked to keep it (a pooling request), else None. A decode step
        replays its CUDA graph where one was captured (its logits computed), anything else runs
        eagerly to the logit rows' hidden states, whose logits the step sampler has computed
        (runtime/exec/step_logits.py). `future_ids`: the previous step's sampled ids on the device,
        for entries that name a future token."""
        self.kv.before_step()  # copies into promoted slots land first (runtime/kv/tier_copy.py)
        if self.threads is not None:
            self.threads.before_step()  # fewer CPU threads while other processes hold our cores
        lora = LoraBatch.of([e.lora for e in entries], [len(e.token_ids) for e in entries], self.device) \
            if self.lora_targets is not None else None
        if self.graphs is not None and lora is None and self.graphs.fits(entries):
            logits, packed = self.graphs.run(entries, future_ids)
            return StepLogits.computed(logits), packed, None
        packed = HostBatch.pack(entries, self.table)
        batch = ForwardBatch.upload(packed, self.table, future_ids)
        batch.lora = lora
        rows, hidden = self.forward_rows(batch)
        if self._weight_rows is None:
            logits = StepLogits.computed(self.compute_logits(rows))
        else:
            logits = StepLogits(rows, self.compute_logits, self._weight_rows, self.softcap, self._logit_width)
        # a pooling request reads the hidden states themselves
        return logits, packed, hidden if any(e.keep_hidden for e in entries) else None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits [rows, vocab] on the device for the rows the batch asks for."""
        return self.compute_logits(self.forward_rows(batch)[0])

    @torch.inference_mode()
    def forward_rows(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The final (normed) hidden state of every logit row [rows, hidden], and of every new token
        [tokens, hidden]."""
        with forward_context(ForwardContext(batch.attn, self.pool.k, self.pool.v, self.backend, batch.lora)):
            hidden = self.model(batch.input_ids, batch.positions)
        rows = hidden if batch.logit_rows is None else hidden.index_select(0, batch.logit_rows)
        return rows, hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [rows, vocab] of final hidden states: the output layer, then the softcap."""
        logits = self.output_layer(hidden, self.model.output_weight)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

