"""Writes a tiny Gemma 3 GGUF (random weights, a small SentencePiece-style vocabulary) for tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 2, 1, 32


def tiny_vocab() -> list[str]:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁", "▁the", "▁cat", "▁sat", "▁on", "▁mat", "a", "b", "c", "d", "e", "t", "s", "h"]
    return specials + bytes_ + words


def quantize_q6_k(array: np.ndarray) -> np.ndarray:
    """Float weights [..., K] (K a multiple of 256) as llama.cpp's Q6_K blocks (gguf-py quantizes
    no k-quant): per super-block of 256, codes 0..63 (the value less 32) as 128 bytes of low
    nibbles and 64 of top bits, a signed 8-bit scale a group of 16, a float16 d. Each group's scale
    fits its largest weight to 31 steps (llama.cpp searches; rounding-only is enough for tests)."""
    shape = array.shape
    x = array.astype(np.float32).reshape(-1, 16, 16)  # super-blocks x groups x weights
    group = np.abs(x).max(-1) / 31
    d = (group.max(-1) / 127).astype(np.float16)
    step = d.astype(np.float32)[:, None]
    scale = np.clip(np.rint(np.divide(group, step, out=np.zeros_like(group), where=step > 0)), -128, 127)
    each = step * scale
    q = np.clip(np.rint(np.divide(x, each[..., None], out=np.zeros_like(x), where=each[..., None] > 0)), -32, 31)
    u = (q.reshape(-1, 2, 4, 32) + 32).astype(np.uint8)  # [super-block, half, run of 32, l]
    low = np.concatenate([(u[:, :, 0] & 15) | (u[:, :, 2] & 15) << 4, (u[:, :, 1] & 15) | (u[:, :, 3] & 15) << 4], -1)
    high = (u[:, :, 0] >> 4) | (u[:, :, 1] >> 4) << 2 | (u[:, :, 2] >> 4) << 4 | (u[:, :, 3] >> 4) << 6
    blocks = np.concatenate([low.reshape(-1, 128), high.reshape(-1, 64), scale.astype(np.int8).view(np.uint8),
                             d.view(np.uint8).reshape(-1, 2)], -1)
    return blocks.reshape(*shape[:-1], shape[-1] // 256 * 210)


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


# Hugging Face name (after "model.layers.N.") -> GGUF name (after "blk.N."), for writing a tiny HF
# model as llama.cpp's converter would (Qwen families: no Q/K permutation).
HF_TO_GGUF = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3's fused
}


def write_gguf_from_hf(folder: Path, path: Path, arch: str,
                       kinds: dict[str, GGMLQuantizationType] | None = None, split_max_tensors: int = 0) -> None:
    """Write the tiny Hugging Face model in `folder` (tests/tiny_models.py) as a float32 GGUF of
    architecture `arch` (llama, qwen3, qwen3moe, qwen2moe, phi3, gpt-oss) as llama.cpp writes one: experts stacked
    [E, rows, cols], a Llama file's q and k rows reordered for interleaved RoPE, Phi-3's LongRoPE
    factors as tensors and its fused q/k/v and gate/up as they are. `kinds`: matrices
    quantized instead, by GGUF tensor name without `blk.N.` (`*` for the rest; 2-D and 3-D).
    `split_max_tensors`: written as a split GGUF of parts holding at most that many tensors each."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    state = load_file(str(folder / "model.safetensors"))
    writer = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)  # split: path-0000i-of-0000n.gguf
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None)
                              else config.rope_theta)
    if arch == "gpt-oss":
        from tests.tiny_gguf_gpt_oss import add_gpt_oss_metadata

        add_gpt_oss_metadata(writer, config)
    elif getattr(config, "num_experts", 0):
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if getattr(config, "shared_expert_intermediate_size", 0):
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    scaling = getattr(config, "rope_parameters", None) or {}
    if arch == "llama" and scaling.get("rope_type") == "llama3":  # Llama 3.1+: the factors, as llama.cpp writes them
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
        plain = scaling["rope_theta"] ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        writer.add_tensor("rope_freqs.weight", (plain / scaled.double()).float().numpy())
    if arch == "phi3":
        add_phi3_rope(writer, config, head_dim)
    vocab = tiny_vocab()[: config.vocab_size]
    vocab += [f"<extra_{i}>" for i in range(config.vocab_size - len(vocab))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * len(vocab))
    writer.add_token_types([3] * 6 + [6] * 256 + [1] * (len(vocab) - 262))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    def add(gguf_name: str, array: np.ndarray) -> None:
        short = gguf_name.split(".", 2)[-1] if gguf_name.startswith("blk.") else gguf_name
        kind = None if kinds is None or array.ndim < 2 else kinds.get(short, kinds.get("*"))
        if kind is None or array.shape[-1] % GGML_QUANT_SIZES[kind][0]:
            writer.add_tensor(gguf_name, array)
            return
        packed = quantize_q6_k(array) if kind == GGMLQuantizationType.Q6_K else quantize(array, kind)
        writer.add_tensor(gguf_name, packed, raw_shape=packed.shape, raw_dtype=kind)

    if arch == "gpt-oss":
        from tests.tiny_gguf_gpt_oss import gpt_oss_tensors

        for gguf_name, array in gpt_oss_tensors(state):
            add(gguf_name, array)
    layers: dict[int, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in state.items():
        if arch == "gpt-oss" and name.startswith("model.layers."):
            continue
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            gguf = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}[name]
            add(gguf, tensor.float().numpy())
            continue
        _, _, index, rest = name.split(".", 3)
        if ".experts." in rest:  # mlp.experts.E.gate_proj.weight: stacked below
            _, _, expert, proj, _ = rest.split(".")
            layers.setdefault(int(index), {}).setdefault(proj, {})[int(expert)] = tensor
            continue
        if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            # llama.cpp reorders a Llama file's q and k rows for its interleaved RoPE
            heads = config.num_attention_heads if rest.startswith("self_attn.q") else config.num_key_value_heads
            rows, cols = tensor.shape
            tensor = tensor.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)
        add(f"blk.{index}.{HF_TO_GGUF[rest]}", tensor.float().numpy())
    for index, projections in sorted(layers.items()):
        for proj, experts in projections.items():
            stacked = torch.stack([experts[e] for e in sorted(experts)]).float().numpy()
            gguf = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}[proj]
            add(f"blk.{index}.{gguf}.weight", stacked)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_phi3_rope(writer: GGUFWriter, config: object, head_dim: int) -> None:
    """Phi-3's rotary metadata and LongRoPE factors, as llama.cpp's Phi3MiniModel writes them."""
    import math

    rope = config.rope_parameters
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    original = config.original_max_position_embeddings
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_sliding_window(config.sliding_window or 0)
    if rope.get("rope_type") == "longrope":
        scale = config.max_position_embeddings / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
