"""Writes a tiny Gemma 3 GGUF (random weights, a small SentencePiece-style vocabulary) for tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 2, 1, 32


def tiny_vocab() -> list[str]:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁", "▁the", "▁cat", "▁sat", "▁on", "▁mat", "a", "b", "c", "d", "e", "t", "s", "h"]
    return specials + bytes_ + words


FOUR_BIT_KINDS = {"attn_output": GGMLQuantizationType.Q4_0, "ffn_down": GGMLQuantizationType.Q4_1}
MIXED_KINDS = {**FOUR_BIT_KINDS, **{name: GGMLQuantizationType.Q5_0 for name in ("attn_q", "attn_k", "ffn_gate", "ffn_up")}}


def write_tiny_gemma3_gguf(path: Path, seed: int = 0, four_bit: bool = False, mixed: bool = False) -> dict[str, np.ndarray]:
    """Write the file; return the float32 weights as they should come back (HF names). Matrices
    are Q8_0; with `four_bit`, the attention output and down projections are Q4_0 and Q4_1 (the
    4-bit formats `--quantization int4` serves as shipped); `mixed` adds Q5_0 for q, k, gate and
    up (a llama.cpp Q4_K_M-like mix, every format `--quantization gguf` serves as shipped)."""
    kinds = MIXED_KINDS if mixed else FOUR_BIT_KINDS if four_bit else {}
    rng = np.random.default_rng(seed)
    vocab = tiny_vocab()
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * 262 + [-float(i) for i in range(len(vocab) - 262)])
    writer.add_token_types([3] * 6 + [6] * 256 + [1] * (len(vocab) - 262))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)

    expected: dict[str, np.ndarray] = {}

    def tensor(name: str, hf: str, shape: tuple[int, ...], quant: bool, norm: bool = False) -> None:
        data = rng.standard_normal(shape).astype(np.float32)
        if quant:
            kind = kinds.get(name.split(".")[-2], GGMLQuantizationType.Q8_0)
            packed = quantize(data, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)
            from gguf.quants import dequantize

            data = dequantize(packed, kind).reshape(shape)
        else:
            writer.add_tensor(name, data)
        expected[hf] = data - 1.0 if norm else data

    tensor("token_embd.weight", "model.embed_tokens.weight", (len(vocab), HIDDEN), quant=True)
    tensor("output_norm.weight", "model.norm.weight", (HIDDEN,), quant=False, norm=True)
    for i in range(LAYERS):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        tensor(p + "attn_q.weight", h + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), True)
        tensor(p + "attn_k.weight", h + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), True)
        tensor(p + "attn_v.weight", h + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), True)
        tensor(p + "attn_output.weight", h + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), True)
        tensor(p + "attn_q_norm.weight", h + "self_attn.q_norm.weight", (HEAD_DIM,), False, norm=True)
        tensor(p + "attn_k_norm.weight", h + "self_attn.k_norm.weight", (HEAD_DIM,), False, norm=True)
        tensor(p + "attn_norm.weight", h + "input_layernorm.weight", (HIDDEN,), False, norm=True)
        tensor(p + "post_attention_norm.weight", h + "post_attention_layernorm.weight", (HIDDEN,), False, norm=True)
        tensor(p + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight", (HIDDEN,), False, norm=True)
        tensor(p + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight", (HIDDEN,), False, norm=True)
        tensor(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", (FFN, HIDDEN), True)
        tensor(p + "ffn_up.weight", h + "mlp.up_proj.weight", (FFN, HIDDEN), True)
        tensor(p + "ffn_down.weight", h + "mlp.down_proj.weight", (HIDDEN, FFN), True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
