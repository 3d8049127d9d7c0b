"""benchmarks/shapes_gguf.py and benchmarks/memory_bound.py: the shapes are the real models', the F16
file holds them with the tokenizer copied over, and a token's bytes count routed experts only.

No llama.cpp and no timing here: the quantizer and the servers run in `make bench-shapes`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from benchmarks.memory_bound import bytes_per_token, peak_rss
from benchmarks.shapes_gguf import SHAPES, Shape, tensors, write_f16
from tests.tiny_gguf import tiny_vocab, write_tiny_gemma3_gguf


def _params(shape: Shape, vocab: int, active: bool = False) -> float:
    total = 0.0
    for name, dims, _ in tensors(shape, shape.layers, vocab):
        share = shape.experts_used / shape.experts if active and "_exps." in name else 1.0
        total += float(np.prod(dims)) * share
    return total


@pytest.mark.parametrize(("name", "vocab", "published", "active"), [
    ("llama-3.2-1b", 128256, 1.236e9, False),  # Llama-3.2-1B: 1.24B, tied embedding
    ("qwen2.5-7b", 152064, 7.62e9, False),  # Qwen2.5-7B: 7.61B
    ("qwen3-30b-a3b", 151936, 30.5e9, False),  # Qwen3-30B-A3B: 30.5B in all
    ("qwen3-30b-a3b", 151936, 3.3e9, True),  # ... 3.3B activated
])
def test_each_shape_has_its_models_parameter_count(name: str, vocab: int, published: float, active: bool) -> None:
    assert abs(_params(SHAPES[name], vocab, active) / published - 1) < 0.02  # published figures are rounded


def test_the_f16_file_holds_the_shape_and_the_tokenizer(tmp_path: Path) -> None:
    tokenizer_source = tmp_path / "tok.gguf"
    write_tiny_gemma3_gguf(tokenizer_source)
    shape = replace(SHAPES["qwen3-30b-a3b"], hidden=256, heads=4, kv_heads=2, head_dim=64, experts=4,
                    experts_used=2, expert_ffn=256)
    out = tmp_path / "shape.gguf"
    write_f16(shape, 2, tokenizer_source, out)
    reader = GGUFReader(str(out))
    got = {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
    vocab = len(tiny_vocab())
    assert got["token_embd.weight"] == ("F16", (vocab, 256))
    assert got["blk.1.ffn_down_exps.weight"] == ("F16", (4, 256, 256))
    assert got["blk.0.ffn_gate_inp.weight"] == ("F32", (4, 256)) and got["output.weight"] == ("F16", (vocab, 256))
    assert "blk.2.attn_q.weight" not in got
    assert reader.fields["qwen3moe.expert_used_count"].contents() == 2
    assert reader.fields["tokenizer.ggml.tokens"].contents() == tiny_vocab()
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == 2
    norms = next(t for t in reader.tensors if t.name == "blk.0.attn_norm.weight")
    assert np.all(norms.data == 1.0)
    expert_bytes = sum(int(t.n_bytes) for t in reader.tensors if "_exps." in t.name)
    embedding = next(int(t.n_bytes) for t in reader.tensors if t.name == "token_embd.weight")
    everything = sum(int(t.n_bytes) for t in reader.tensors)
    assert bytes_per_token(out) == everything - embedding - expert_bytes // 2  # 2 of 4 experts; one embedding row


def test_peak_rss_reads_this_process() -> None:
    import os

    assert peak_rss(os.getpid()) > 10 * 2**20
