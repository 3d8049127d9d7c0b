"""The forward context: what every attention layer needs for the current step, set once by the runner.

It travels beside the model call instead of through every layer's signature (as in nano-vllm).
Thread-local, so two engines in one process never see each other's step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kernels import AttentionMetadata


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    k_caches: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    v_caches: list[torch.Tensor]
    backend: object  # a kernels attention backend
    lora: object | None = None  # the step's LoRA adapter groups (runtime/lora/apply.py: LoraBatch); None: none


_local = threading.local()


def get_context() -> ForwardContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("no forward context: models run only inside ModelRunner.forward")
    return ctx


def current_lora() -> object | None:
    """The step's LoRA groups, or None (no adapter in this step, or no step running: a model called
    outside the runner, as the parity tests of model code do)."""
    ctx = getattr(_local, "ctx", None)
    return None if ctx is None else ctx.lora


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = None
