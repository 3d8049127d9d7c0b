"""Decoding a GGUF's quantized blocks in C++ (kernels/csrc/gguf_blocks.cpp): for every format a GGUF's
codes are kept in, the same codes, scales and lows as the numpy decoders (runtime/loading/
gguf_groups.py, gguf_int8_groups.py; themselves checked against `gguf.quants.dequantize`), bit
for bit, groups whose scale is 0 included; a wrong block size or buffer size is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from kernels.cpu_ops import ops
from runtime.loading import gguf_groups, gguf_int8_groups

pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
FOUR_BIT, EIGHT_BIT = (Q.Q4_0, Q.Q4_1, Q.Q4_K), (Q.Q8_0, Q.Q5_0, Q.Q6_K)
F16_AT = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q4_K: [0, 2], Q.Q8_0: [0], Q.Q5_0: [0], Q.Q6_K: [208]}  # byte offsets


def random_blocks(kind: Q, count: int, seed: int) -> np.ndarray:
    """Random codes and scales; the float16 fields finite and weight-sized; block 3 with a zero d."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(count, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
    for at in F16_AT[kind]:
        blocks[:, at:at + 2] = (rng.standard_normal(count) * 0.01).astype(np.float16).view(np.uint8).reshape(count, 2)
    blocks[3, F16_AT[kind][0]:F16_AT[kind][0] + 2] = 0
    if kind == Q.Q6_K:
        blocks[5, 192:200] = 0  # half a block's run scales zero
    return blocks


def decode(kind: Q, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    weights = blocks.shape[0] * GGML_QUANT_SIZES[kind][0]
    group = 16 if kind == Q.Q6_K else 32
    if kind in FOUR_BIT:
        out = (np.empty(weights // 2, np.uint8), np.empty(weights // group, np.float32), np.empty(weights // group, np.float32))
    else:
        out = (np.empty(weights, np.int8), np.empty(weights // group, np.float32 if kind == Q.Q6_K else np.float16),
               np.empty(0, np.float32))
    ops().decode_gguf_blocks(int(kind), *(torch.from_numpy(a) for a in (blocks, *out)))  # type: ignore[union-attr]
    return out if kind in FOUR_BIT else out[:2]


@pytest.mark.parametrize("kind", FOUR_BIT, ids=lambda k: k.name)
def test_4bit_blocks_decode_as_numpy_does(kind: Q) -> None:
    blocks = random_blocks(kind, 64, int(kind))
    nibbles, scales, lows = decode(kind, blocks)
    want = gguf_groups.tensor_groups(kind, blocks, (4, 64 * GGML_QUANT_SIZES[kind][0] // 4))
    q = want.q.numpy()
    assert np.array_equal(nibbles.reshape(4, -1), q[:, 0::2] | (q[:, 1::2] << 4))
    assert np.array_equal(scales.view(np.uint32), want.scales.numpy().reshape(-1).view(np.uint32))
    assert np.array_equal(lows.view(np.uint32), want.lows.numpy().reshape(-1).view(np.uint32))


@pytest.mark.parametrize("kind", EIGHT_BIT, ids=lambda k: k.name)
def test_8bit_blocks_decode_as_numpy_does(kind: Q) -> None:
    blocks = random_blocks(kind, 64, int(kind))
    codes, scales = decode(kind, blocks)
    want = gguf_int8_groups.tensor_groups(kind, blocks, (4, 64 * GGML_QUANT_SIZES[kind][0] // 4))
    assert np.array_equal(codes, want.codes.numpy().reshape(-1))  # zero-scale groups: codes 0 both ways
    assert scales.dtype == want.scales.numpy().dtype
    assert np.array_equal(scales.view(np.uint8), want.scales.numpy().reshape(-1).view(np.uint8))


def test_wrong_sizes_are_refused() -> None:
    blocks = random_blocks(Q.Q4_K, 4, 0)
    with pytest.raises(RuntimeError, match="blocks of 144 bytes"):
        decode(Q.Q4_K, blocks[:, :100].copy())
    with pytest.raises(RuntimeError, match="output sizes"):
        ops().decode_gguf_blocks(int(Q.Q4_K), torch.from_numpy(blocks), torch.empty(10, dtype=torch.uint8),  # type: ignore[union-attr]
                                 torch.empty(32), torch.empty(32))
    with pytest.raises(RuntimeError, match="not kept as codes"):
        ops().decode_gguf_blocks(int(Q.Q5_1), torch.from_numpy(blocks), torch.empty(0), torch.empty(0), torch.empty(0))  # type: ignore[union-attr]
