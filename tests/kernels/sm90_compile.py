"""Compile every Triton kernel for the H100 (sm_90) with the argument types its launcher passes.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python and accepts code the compiler rejects
(an int32 variable re-bound to int64 in a branch, say). This module runs the backend's real
launch path with each kernel swapped for a recorder, then hands each recorded launch to
`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`, which goes down to cubin
with the ptxas the triton wheel ships: no GPU needed. Types come from Triton's own
specialisation rules (`mangle_type`), so they match what a real launch would compile.

Run as a script (the test does, in a subprocess, since the interpreter must be off):
    python -m tests.kernels.sm90_compile
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: compile, don't interpret

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction, mangle_type  # noqa: E402

import kernels.triton_attention as ta  # noqa: E402
from kernels import AttentionMetadata  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)


@dataclass
class Launch:
    kernel: JITFunction
    args: tuple
    kwargs: dict


class Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](...)` records instead of launching."""

    def __init__(self, kernel: JITFunction, log: list[Launch]) -> None:
        self.kernel = kernel
        self.log = log

    def __getitem__(self, grid: object):  # noqa: ANN204
        return lambda *args, **kwargs: self.log.append(Launch(self.kernel, args, kwargs))


def signature_of(launch: Launch) -> tuple[dict[str, str], dict[str, object]]:
    """(signature, constexprs) exactly as Triton's JIT would specialise this call."""
    fn = launch.kernel
    bound = dict(zip(fn.arg_names, launch.args))
    bound.update(launch.kwargs)
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    for param in fn.params:
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
            continue
        kind = mangle_type(value, not param.do_not_specialize)
        signature[param.name] = kind
        if kind == "constexpr":  # Triton specialises integer arguments equal to 1
            constexprs[param.name] = value
    return signature, constexprs


def record(backend: ta.TritonAttentionBackend, case: dict) -> list[Launch]:
    """Run one ragged batch through the backend with recorders in place of the kernels."""
    log: list[Launch] = []
    names = [n for n, v in vars(ta).items() if isinstance(v, JITFunction) and not n.startswith("_softmax")]
    saved = {n: getattr(ta, n) for n in names}
    try:
        for n in names:
            setattr(ta, n, Recorder(saved[n], log))
        q, k, v, k_cache, v_cache, meta = make_batch(**case)
        backend.forward(q, k, v, k_cache, v_cache, meta, q.shape[-1] ** -0.5, case.get("window"))
    finally:
        for n, kernel in saved.items():
            setattr(ta, n, kernel)
    return log


def make_batch(head_dim: int, kv_heads: int, group: int, dtype: torch.dtype, page: int = 16,
               window: int | None = None, extends=((0, 40), (32, 7)), decodes=(300, 5),  # noqa: ANN001, ANN201
               decode_splits: int | None = None):
    seqs = [p + n for p, n in extends] + list(decodes)
    slots_needed = sum(-(-s // page) * page for s in seqs)
    table = torch.zeros((len(seqs), max(seqs)), dtype=torch.int64)
    start = 0
    for i, s in enumerate(seqs):
        table[i, :s] = torch.arange(start, start + s)
        start += -(-s // page) * page
    prefix = [p for p, _ in extends] + [s - 1 for s in decodes]
    ext = [n for _, n in extends] + [1] * len(decodes)
    out_slots = torch.cat([table[i, p : p + n] for i, (p, n) in enumerate(zip(prefix, ext))])
    meta = AttentionMetadata.build(out_slots, table, prefix, ext)
    meta.decode_splits = decode_splits  # as a captured CUDA graph fixes them (runtime/exec/graph_runner.py)
    heads = kv_heads * group
    t = len(out_slots)
    q = torch.randn(t, heads, head_dim).to(dtype)
    k = torch.randn(t, kv_heads, head_dim).to(dtype)
    v = torch.randn(t, kv_heads, head_dim).to(dtype)
    k_cache = torch.zeros(slots_needed, kv_heads, head_dim, dtype=dtype)
    return q, k, v, k_cache, k_cache.clone(), meta


CASES = [
    # Gemma 3 270M: head_dim 256, 4 query heads over 1 KV head (MQA-like GQA), sliding window.
    dict(head_dim=256, kv_heads=1, group=4, dtype=torch.bfloat16, window=512),
    # Llama-style: head_dim 64, GQA 4, full attention, fp32 KV.
    dict(head_dim=64, kv_heads=2, group=4, dtype=torch.float32),
    # Qwen-style: head_dim 128, GQA 7 (not a power of two), page 1.
    dict(head_dim=128, kv_heads=2, group=7, dtype=torch.bfloat16, page=1),
    # A CUDA-graph decode step: decodes only, padding rows of length 1, splits fixed for the size.
    dict(head_dim=256, kv_heads=1, group=4, dtype=torch.bfloat16, window=512, extends=(), decodes=(300, 5, 1, 1),
         decode_splits=64),
]


def compile_all(cases: list[dict] = CASES) -> list[str]:
    """Compile every distinct launch of every case; returns one line per compiled kernel."""
    backend = ta.TritonAttentionBackend()
    done: dict[str, str] = {}
    for case in cases:
        for launch in record(backend, case):
            signature, constexprs = signature_of(launch)
            key = f"{launch.kernel.__name__} {sorted(signature.items())} {sorted(constexprs.items(), key=str)}"
            if key in done:
                continue
            start = time.perf_counter()
            compiled = triton.compile(ASTSource(launch.kernel, signature, constexprs), target=H100)
            assert compiled.asm.get("cubin"), f"{launch.kernel.__name__}: no cubin"
            done[key] = (f"{launch.kernel.__name__}: sm_90 cubin {len(compiled.asm['cubin'])} bytes "
                         f"in {time.perf_counter() - start:.1f}s ({', '.join(f'{k}={v}' for k, v in constexprs.items())})")
    return list(done.values())


if __name__ == "__main__":
    for line in compile_all():
        print(line, flush=True)
    sys.exit(0)
