"""Random-weight GGUFs with the layer shapes of models people run, quantized by llama.cpp itself.

For `benchmarks/real_shapes.py`. Each shape is a real model's (Llama-3.2-1B, Qwen2.5-7B,
Qwen3-30B-A3B: hidden size, heads, KV heads, head size, feed-forward and expert sizes, biases,
QK-norm, tied or untied output), with as many of its layers as asked. The file is written as F16
with the `gguf` package, tensor by tensor (never all in memory), carrying the tokenizer metadata of
the built-in Qwen2.5-Coder-1.5B-Instruct GGUF (so the vocabulary, and the embedding's rows, are
Qwen's 151,936 tokens, not the shape's own: Llama-3.2-1B has 128,256, Qwen2.5-7B 152,064), then
quantized to Q4_K_M by `llama_cpp.llama_model_quantize` in llama.cpp's peer venv
(benchmarks/peers.py installs it). Files are cached under $RADIXSERVE_HOME/shapes/ (default
~/.cache/radixserve/shapes), never in git; a file is renamed into place only once complete.

Weights are N(0, 0.02) F16 values drawn once into a pool and sliced at random offsets (drawing
billions of values afresh would take minutes and measure nothing different); norms are ones.

    python -m benchmarks.shapes_gguf llama-3.2-1b [--layers N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QUANTIZE = """
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.nthread = int(sys.argv[3])
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params))
sys.exit(rc)
"""


@dataclass(frozen=True)
class Shape:
    name: str
    title: str
    arch: str  # the GGUF architecture llama.cpp and our converter read
    hidden: int
    ffn: int  # dense feed-forward size (0: every layer has experts)
    layers: int  # the real model's layer count
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    tied: bool = False  # output layer = the embedding
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("llama-3.2-1b", "Llama-3.2-1B", "llama", hidden=2048, ffn=8192, layers=16, heads=32, kv_heads=8,
          head_dim=64, rope_theta=500000.0, tied=True),
    Shape("qwen2.5-7b", "Qwen2.5-7B", "qwen2", hidden=3584, ffn=18944, layers=28, heads=28, kv_heads=4,
          head_dim=128, rope_theta=1000000.0, qkv_bias=True),
    Shape("qwen3-30b-a3b", "Qwen3-30B-A3B", "qwen3moe", hidden=2048, ffn=0, layers=48, heads=32, kv_heads=4,
          head_dim=128, rope_theta=1000000.0, qk_norm=True, experts=128, experts_used=8, expert_ffn=768),
)}


def shapes_dir() -> Path:
    home = Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))
    return home / "shapes"


def tensors(shape: Shape, layers: int, vocab: int) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, numpy shape (rows last is the input), is a norm/bias kept in F32) in file order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "token_embd.weight", (vocab, h), False
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), True
        yield b + "attn_q.weight", (q, h), False
        yield b + "attn_k.weight", (kv, h), False
        yield b + "attn_v.weight", (kv, h), False
        if shape.qkv_bias:
            yield b + "attn_q.bias", (q,), True
            yield b + "attn_k.bias", (kv,), True
            yield b + "attn_v.bias", (kv,), True
        if shape.qk_norm:
            yield b + "attn_q_norm.weight", (shape.head_dim,), True
            yield b + "attn_k_norm.weight", (shape.head_dim,), True
        yield b + "attn_output.weight", (h, q), False
        yield b + "ffn_norm.weight", (h,), True
        if shape.experts:
            e, f = shape.experts, shape.expert_ffn
            yield b + "ffn_gate_inp.weight", (e, h), True  # the router: llama.cpp keeps it F32
            yield b + "ffn_gate_exps.weight", (e, f, h), False
            yield b + "ffn_up_exps.weight", (e, f, h), False
            yield b + "ffn_down_exps.weight", (e, h, f), False
        else:
            yield b + "ffn_gate.weight", (shape.ffn, h), False
            yield b + "ffn_up.weight", (shape.ffn, h), False
            yield b + "ffn_down.weight", (h, shape.ffn), False
    yield "output_norm.weight", (h,), True
    if not shape.tied:
        yield "output.weight", (vocab, h), False


def _add_metadata(writer, shape: Shape, layers: int, tokenizer_gguf: Path) -> int:  # noqa: ANN001 - a GGUFWriter
    """The shape's hyperparameters and the tokenizer.* fields of `tokenizer_gguf`; returns the vocab size."""
    from gguf import GGUFReader, GGUFValueType

    writer.add_name(f"{shape.title} shape, {layers} layers, random weights")
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(shape.ffn or shape.expert_ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_file_type(1)  # MOSTLY_F16
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.expert_ffn)
    reader = GGUFReader(str(tokenizer_gguf))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(key, value, kind, sub)
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    if not vocab:
        raise ValueError(f"{tokenizer_gguf}: no tokenizer.ggml.tokens to take the vocabulary from")
    return vocab


def write_f16(shape: Shape, layers: int, tokenizer_gguf: Path, path: Path, seed: int = 0) -> None:
    """Write the F16 GGUF tensor by tensor."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 25, dtype=np.float32) * 0.02).astype(np.float16)
    writer = GGUFWriter(str(path), shape.arch)
    vocab = _add_metadata(writer, shape, layers, tokenizer_gguf)
    plan = list(tensors(shape, layers, vocab))
    for name, dims, keep_f32 in plan:
        dtype = np.float32 if keep_f32 else np.float16
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, keep_f32 in plan:
        count = int(np.prod(dims))
        if keep_f32:
            data = np.ones(dims, np.float32) if name.endswith("norm.weight") else \
                (pool[:count].astype(np.float32).reshape(dims) if count <= pool.size else np.zeros(dims, np.float32))
        else:
            start = int(rng.integers(0, pool.size))
            data = np.resize(np.roll(pool, -start) if count > pool.size else pool[start:], count).reshape(dims)
        writer.write_tensor_data(data)
    writer.close()


def quantize_q4_k_m(llama_python: Path, source: Path, target: Path) -> None:
    """llama.cpp's own quantizer, run in its venv (we never link llama.cpp into our process)."""
    done = subprocess.run([str(llama_python), "-c", QUANTIZE, str(source), str(target), str(os.cpu_count() or 2)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} (exit {done.returncode}): {done.stderr[-2000:]}")


def ensure_shape_gguf(shape: Shape, layers: int, tokenizer_gguf: Path, llama_python: Path,
                      log=print) -> Path:  # noqa: ANN001 - a print-like function
    """The cached Q4_K_M file for `shape` with `layers` layers, written and quantized on first use."""
    folder = shapes_dir()
    target = folder / f"{shape.name}-{layers}L-random-q4_k_m.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shape-", dir=folder) as tmp:
        f16 = Path(tmp) / "f16.gguf"
        log(f"writing {shape.title}'s shape ({layers} of {shape.layers} layers) as F16: {f16}")
        write_f16(shape, layers, tokenizer_gguf, f16)
        log(f"quantizing to Q4_K_M with llama.cpp ({f16.stat().st_size / 2**30:.1f} GiB of F16)")
        partial = Path(tmp) / "q4_k_m.gguf"
        quantize_q4_k_m(llama_python, f16, partial)
        partial.rename(target)  # same file system: whole or absent
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="default: the real model's")
    args = parser.parse_args(argv)
    from benchmarks.real_shapes import coder_gguf, llama_python

    shape = SHAPES[args.shape]
    print(ensure_shape_gguf(shape, args.layers or shape.layers, coder_gguf(), llama_python()))


if __name__ == "__main__":
    sys.exit(main())
