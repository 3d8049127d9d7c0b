"""MXFP4 weights as transformers' gpt-oss checkpoints ship them (OpenAI's gpt-oss-20b / 120b
folders), dequantized: `*_blocks` [..., groups, 16] uint8, two E2M1 codes a byte (the even
element in the low nibble), and `*_scales` [..., groups] uint8, an E8M0 exponent per 32 weights
(2 ** (scale - 127)). No kernel of ours reads MXFP4, so they are dequantized at load (as a GGUF's
MXFP4 tensors are when it is converted).
"""

from __future__ import annotations

import torch

# E2M1: sign, two exponent bits, one mantissa bit
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS, SCALES = "_blocks", "_scales"


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., groups, 16] codes and [..., groups] exponents -> [..., groups * 32] float32."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4: blocks {tuple(blocks.shape)} {blocks.dtype} do not match scales "
                         f"{tuple(scales.shape)} {scales.dtype}")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1).flatten(-2)
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.flatten(-2)
