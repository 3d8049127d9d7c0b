"""The model runner: loads a checkpoint into our model code, owns the KV pool, runs one ForwardBatch."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kernels import AttentionMetadata, get_attention_backend
from runtime.context import ForwardContext, forward_context
from runtime.forward_batch import ForwardBatch
from runtime.kv_pool import KVPool
from runtime.models import model_class
from runtime.models.llama import head_dim_of
from runtime.models.weights import iterate_weights
from runtime.slot_table import ReqSlotTable

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "fp32": torch.float32, "bf16": torch.bfloat16}


def resolve_dtype(name: str) -> torch.dtype:
    """`auto` is bfloat16 on this CPU (measured: see benchmarks/), else the named dtype."""
    if name == "auto":
        return torch.bfloat16
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def load_model(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, object]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config)
    model.to_empty(device="cpu")
    model.to(dtype)
    model.load_weights(iterate_weights(folder))
    model.eval().requires_grad_(False)
    return model, config


@dataclass
class RunnerConfig:
    model_path: Path
    dtype: str = "auto"
    num_slots: int = 4096
    max_requests: int = 64
    max_context: int = 4096
    attention_backend: str = "auto"


class ModelRunner:
    def __init__(self, cfg: RunnerConfig) -> None:
        start = time.perf_counter()
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(str(cfg.model_path))
        self.dtype = resolve_dtype(cfg.dtype)
        self.model, _ = load_model(cfg.model_path, self.dtype)
        self.vocab_size: int = self.config.vocab_size
        self.context_len = min(cfg.max_context, int(getattr(self.config, "max_position_embeddings", cfg.max_context)))
        self.pool = KVPool(self.config.num_hidden_layers, cfg.num_slots, self.config.num_key_value_heads,
                           head_dim_of(self.config), self.dtype)
        self.table = ReqSlotTable(cfg.max_requests, self.context_len)
        self.backend = get_attention_backend(cfg.attention_backend, "cpu")
        self.softcap: float | None = getattr(self.config, "final_logit_softcapping", None)
        logger.info("loaded %s (%s) in %.1fs; KV pool %d slots, %.0f MiB", cfg.model_path.name, self.dtype,
                    time.perf_counter() - start, cfg.num_slots, self.pool.nbytes() / 2**20)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits [len(batch.logit_rows), vocab] for the rows the batch asks for."""
        slot_table = self.table.table[batch.rows, : batch.max_seq_len]
        meta = AttentionMetadata.build(batch.out_slots, slot_table, batch.prefix_lens, batch.extend_lens)
        with forward_context(ForwardContext(meta, self.pool.k, self.pool.v, self.backend)):
            hidden = self.model(batch.input_ids, batch.positions)
        return self.compute_logits(hidden[batch.logit_rows])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.output_weight
        if hidden.shape[0] == 1:
            logits = F.linear(hidden, weight).float()
        else:
            # weight @ hidden.T takes a faster GEMM path than hidden @ weight.T for the tall, thin
            # output layer (measured: 45 ms vs 81 ms at batch 64 for Gemma's 262k vocabulary).
            # Made row-major before anything reads rows of it (sampling gathers rows).
            logits = torch.mm(weight, hidden.t()).t().contiguous().float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
