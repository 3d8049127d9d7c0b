"""GPU benchmark of the Triton attention kernels: decode and extend, tokens/s and achieved KV bandwidth.

KV pages are scattered over the pool as the allocator hands them out after some churn (a random
permutation of pages), not laid out contiguously. Each figure is the median of CUDA-event timed
repetitions after a warm-up, on random (never zero) data. Bandwidth counts the K and V bytes
each step must read once: batch x context x kv_heads x head_dim x 2 (K, V) x 2 bytes (bf16).
The H100 machine's measured copy rate is 2.97 TB/s (see DESIGN.md); the issue's target for
decode at batch 64 and 4k context is half of that.

Needs a CUDA GPU; on a machine without one it says so and exits 0.

    python -m benchmarks.gpu_attention [--shapes gemma3-270m llama-8b] [--batches 1 16 64 256]
        [--context 4096] [--page-size 1] [--json benchmarks/results/gpu_attention.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

# name -> (query heads, kv heads, head dim, sliding window of its local layers or None)
SHAPES = {
    "gemma3-270m": (4, 1, 256, None),
    "gemma3-270m-local": (4, 1, 256, 512),
    "llama-3.2-1b": (32, 8, 64, None),
    "llama-8b": (32, 8, 128, None),
}
PEAK_GBPS = 2970.0


def _time(fn, reps: int = 30) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def run_case(shape: str, batch: int, context: int, new: int, page: int, backend) -> dict:  # noqa: ANN001
    from kernels import AttentionMetadata

    heads, kv_heads, dim, window = SHAPES[shape]
    dev, dtype = "cuda", torch.bfloat16
    per_req = -(-context // page) * page
    slots = batch * per_req
    pages = torch.randperm(slots // page, device=dev)
    table = (pages.view(batch, -1)[:, :, None] * page + torch.arange(page, device=dev)).view(batch, -1)
    k_cache = torch.randn(slots, kv_heads, dim, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    prefix = context - new
    out_slots = table[:, prefix:context].reshape(-1)
    meta = AttentionMetadata.build(out_slots, table, [prefix] * batch, [new] * batch)
    q = torch.randn(batch * new, heads, dim, device=dev, dtype=dtype)
    k = torch.randn(batch * new, kv_heads, dim, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    seconds = _time(lambda: backend.forward(q, k, v, k_cache, v_cache, meta, dim**-0.5, window))
    span = min(context, window) if window else context
    kv_bytes = 2 * batch * span * kv_heads * dim * 2
    return {"shape": shape, "backend": backend.name, "batch": batch, "context": context, "new_tokens": new,
            "page_size": page, "ms": seconds * 1e3, "tokens_per_s": batch * new / seconds,
            "kv_gbps": kv_bytes / seconds / 1e9, "kv_share_of_peak": kv_bytes / seconds / 1e9 / PEAK_GBPS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["gemma3-270m", "llama-8b"], choices=sorted(SHAPES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--extend", type=int, default=512)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--torch", action="store_true", help="also time the torch reference backend")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_attention.py needs a CUDA GPU; none is available here, so nothing was measured.")
        sys.exit(0)
    from kernels import TorchAttentionBackend
    from kernels.triton_attention import TritonAttentionBackend

    backends = [TritonAttentionBackend()] + ([TorchAttentionBackend()] if args.torch else [])
    rows = []
    for shape in args.shapes:
        for batch in args.batches:
            for phase, new in (("decode", 1), ("extend", args.extend)):
                if phase == "extend" and batch > 64:
                    continue  # a 256 x 512-token extend is a prefill benchmark, not an attention one
                for backend in backends:
                    row = {"phase": phase, **run_case(shape, batch, args.context, new, args.page_size, backend)}
                    rows.append(row)
                    print(f"{shape:>18} {phase:>6} B={batch:<4} {backend.name:>6}: {row['ms']:8.3f} ms "
                          f"{row['tokens_per_s']:12.0f} tok/s {row['kv_gbps']:8.1f} GB/s KV "
                          f"({100 * row['kv_share_of_peak']:.0f}% of {PEAK_GBPS:.0f})", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
