"""GPU benchmark of the Triton attention kernels: decode and extend, tokens/s and achieved bandwidth.

Needs a CUDA GPU; on a machine without one it says so and exits 0.

    python -m benchmarks.gpu_attention [--batches 1 16 64] [--context 4096] [--head-dim 128]
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--extend", type=int, default=512)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_attention.py needs a CUDA GPU; none is available here, so nothing was measured.")
        sys.exit(0)
    from kernels import AttentionMetadata, TorchAttentionBackend
    from kernels.triton_attention import TritonAttentionBackend

    dev, dtype = "cuda", torch.bfloat16
    for batch in args.batches:
        slots = batch * (args.context + args.extend)
        k_cache = torch.randn(slots, args.kv_heads, args.head_dim, device=dev, dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        table = torch.arange(slots, device=dev).view(batch, -1)
        for phase, prefix, new in (("decode", args.context - 1, 1), ("extend", args.context - args.extend, args.extend)):
            out_slots = torch.cat([table[i, prefix : prefix + new] for i in range(batch)])
            meta = AttentionMetadata.build(out_slots, table, [prefix] * batch, [new] * batch)
            tokens = batch * new
            q = torch.randn(tokens, args.heads, args.head_dim, device=dev, dtype=dtype)
            k = torch.randn(tokens, args.kv_heads, args.head_dim, device=dev, dtype=dtype)
            v = torch.randn_like(k)
            for backend in (TritonAttentionBackend(), TorchAttentionBackend()):
                fn = lambda: backend.forward(q, k, v, k_cache, v_cache, meta, args.head_dim**-0.5)  # noqa: E731
                fn()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    fn()
                end.record()
                torch.cuda.synchronize()
                seconds = start.elapsed_time(end) / 20 / 1000
                kv_bytes = 2 * batch * (prefix + new) * args.kv_heads * args.head_dim * 2
                print(f"{phase:>6} B={batch:<3} {backend.name:>6}: {seconds * 1e3:8.3f} ms  "
                      f"{tokens / seconds:12.0f} tok/s  {kv_bytes / seconds / 1e9:7.1f} GB/s of KV read")


if __name__ == "__main__":
    main()
