"""The GGUF families radixserve converts: how each `general.architecture` maps onto a Hugging Face
checkpoint (its config.json, built from the file's metadata; its tensor names; its norm convention;
any reordering of a tensor's rows). runtime/loading/gguf_convert.py does the converting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGUFReader

from runtime.loading.gguf_gpt_oss import (
    GPT_OSS_END_TOKENS, GPT_OSS_LAYER_NAMES, GPT_OSS_SWIGLU, GPT_OSS_YARN_BETAS, gpt_oss_down_proj)

# Tensor names every supported family shares: GGUF (after "blk.N.") -> Hugging Face (after
# "model.layers.N.").
_COMMON_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 has four norms per layer and QK-norm; its "ffn_norm" is the pre-feed-forward norm.
_GEMMA3_LAYER_NAMES = {
    **_COMMON_LAYER_NAMES,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# Qwen2 is Llama-shaped ("ffn_norm" is the post-attention norm) with q/k/v biases.
_QWEN2_LAYER_NAMES = {
    **_COMMON_LAYER_NAMES,
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
}
# Llama (and Mistral, SmolLM: llama.cpp files them under "llama"): "ffn_norm" is the post-attention norm.
_LLAMA_LAYER_NAMES = {**_COMMON_LAYER_NAMES, "ffn_norm.weight": "post_attention_layernorm.weight"}
# Qwen3: Llama-shaped with QK-norm and no biases.
_QWEN3_LAYER_NAMES = {
    **_COMMON_LAYER_NAMES,
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# Mixture-of-experts layers: the router, and each projection of every expert stacked [E, rows, cols]
# (runtime/models/weights.py reads `experts.gate_proj` etc. in that layout); a layer without
# experts keeps the dense names above.
_EXPERT_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj",
    "ffn_up_exps.weight": "mlp.experts.up_proj",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
_SHARED_EXPERT_NAMES = {
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}
_QWEN3MOE_LAYER_NAMES = {**_QWEN3_LAYER_NAMES, **_EXPERT_NAMES}
_QWEN2MOE_LAYER_NAMES = {**_QWEN2_LAYER_NAMES, **_EXPERT_NAMES, **_SHARED_EXPERT_NAMES}
# Phi-3 (Phi-3/3.5-mini, Phi-4-mini, Phi-4): Llama-shaped, shipping q/k/v as one tensor and gate/up as
# one (gate rows first: llama.cpp's SwiGLU halves it as Hugging Face's `chunk(2)` does), the Hugging
# Face checkpoint's own fused qkv_proj and gate_up_proj; a file may ship q, k and v apart instead.
_PHI3_LAYER_NAMES = {
    **_LLAMA_LAYER_NAMES,
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
# LongRoPE's per-frequency factors (Phi-3-128k, Phi-3.5-mini, Phi-4-mini), short and long
PHI3_ROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")
# Tensors that are configuration, not weights (read into config.json instead)
CONFIG_TENSORS = {"rope_freqs.weight", *PHI3_ROPE_FACTORS}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores (1 + w), so we subtract 1.
NORM_SUFFIX = "norm.weight"
# Gemma 3's local (sliding-window) layers use this RoPE base; the GGUF does not record it.
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6


def _field(reader: GGUFReader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF file lacks the metadata key {key!r}")
        return default
    return field.contents()


def gguf_architecture(reader: GGUFReader) -> str:
    """The GGUF's `general.architecture`, checked against the families we convert."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_GGUF_ARCHITECTURES}"
        )
    return arch


def _shared_config(reader: GGUFReader, arch: str) -> dict[str, object]:
    """The config keys every family reads the same way from `<arch>.*` and `tokenizer.*` metadata."""
    return {
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": int(_field(reader, f"{arch}.embedding_length")),
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": int(_field(reader, f"{arch}.attention.head_count")),
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv")),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base")),
        "rope_scaling": None,
        # An untied output layer is stored as its own tensor; a tied one is not stored at all.
        "tie_word_embeddings": "output.weight" not in {t.name for t in reader.tensors},
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        "torch_dtype": "float32",
    }


def gemma3_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Gemma3TextConfig` dict from GGUF metadata."""
    config = _shared_config(reader, "gemma3")
    head_dim = int(_field(reader, "gemma3.attention.key_length"))
    layer_types = [
        "full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
        for i in range(int(config["num_hidden_layers"]))
    ]
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **config,
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": int(_field(reader, "gemma3.attention.sliding_window")),
        "layer_types": layer_types,
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    }


def qwen2_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Qwen2Config` dict from GGUF metadata (full attention in every layer)."""
    config = _shared_config(reader, "qwen2")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **config,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config["num_hidden_layers"],
        "attention_dropout": 0.0,
    }


def qwen3_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Qwen3Config` dict from GGUF metadata."""
    config = _shared_config(reader, "qwen3")
    heads = int(config["num_attention_heads"])
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **config,
        "head_dim": int(_field(reader, "qwen3.attention.key_length", int(config["hidden_size"]) // heads)),
        "hidden_act": "silu",
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config["num_hidden_layers"],
        "attention_dropout": 0.0,
    }


def llama_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `LlamaConfig` dict from GGUF metadata. Llama 3.1+ files carry their RoPE
    scaling as per-frequency factors (`rope_freqs.weight`): read back into Llama 3's parameters."""
    config = _shared_config(reader, "llama")
    heads = int(config["num_attention_heads"])
    head_dim = int(_field(reader, "llama.rope.dimension_count", int(config["hidden_size"]) // heads))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **config,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        config["rope_scaling"] = llama3_rope_scaling(np.asarray(freqs.data, dtype=np.float64), config,
                                                     int(_field(reader, "llama.rope.scaling.original_context_length", 8192)))
    return config


def llama3_rope_scaling(factors: np.ndarray, config: dict[str, object], original: int) -> dict[str, object]:
    """Llama 3's RoPE parameters from llama.cpp's per-frequency factors (inv_freq / factor is the
    scaled frequency). Low frequencies are divided by `factor`, high ones kept, and between them
    the blend s = (original / wavelength - low) / (high - low) is linear in 1 / wavelength; only
    low / original and high / original are determined, so `original` is the file's (or 8192).
    The result is checked against the factors, and a file it does not reproduce is refused."""
    theta, dim = float(config["rope_theta"]), int(config["head_dim"])
    inv_freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor = float(factors.max())
    medium = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    blend = (1 / factors[medium] - 1 / factor) / (1 - 1 / factor)
    x = inv_freq[medium] / (2 * np.pi)  # 1 / wavelength
    if factor <= 1 or medium.sum() < 2:
        raise ValueError("GGUF rope_freqs.weight: too few frequencies between the scaled and the kept ones to read "
                         "Llama 3's RoPE scaling from; a Hugging Face folder of the same model serves")
    slope, intercept = np.polyfit(x, blend, 1)  # blend = original / (high - low) * x - low / (high - low)
    span = original / slope
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(-intercept * span),
               "high_freq_factor": float((1 - intercept) * span), "original_max_position_embeddings": original}
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    check = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type", "rope_scaling")},
                        rope_scaling=scaling)
    got, _ = ROPE_INIT_FUNCTIONS["llama3"](check, "cpu")
    if not np.allclose(got.double().numpy(), inv_freq / factors, rtol=1e-4):
        raise ValueError("GGUF rope_freqs.weight: these frequency factors are not Llama 3's RoPE scaling; "
                         "a Hugging Face folder of the same model serves")
    return scaling


def unpermute_llama_qk(reader: GGUFReader, name: str, weight: torch.Tensor) -> torch.Tensor:
    """llama.cpp stores a Llama file's q and k rows reordered for its interleaved RoPE (each head's
    halves interleaved pair by pair); put them back in the Hugging Face order (halves split)."""
    if name.endswith("self_attn.q_proj.weight"):
        heads = int(_field(reader, "llama.attention.head_count"))
    elif name.endswith("self_attn.k_proj.weight"):
        heads = int(_field(reader, "llama.attention.head_count_kv"))
    else:
        return weight
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _dense_layers(reader: GGUFReader) -> list[int]:
    """The layers of a mixture-of-experts GGUF that have a plain feed-forward block instead."""
    names = {t.name for t in reader.tensors}
    layers = int(_field(reader, f"{_field(reader, 'general.architecture')}.block_count"))
    return [i for i in range(layers) if f"blk.{i}.ffn_gate_exps.weight" not in names]


def _moe_config(reader: GGUFReader, arch: str, base: dict[str, object]) -> dict[str, object]:
    experts_ffn = int(_field(reader, f"{arch}.expert_feed_forward_length"))
    return {
        **base,
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length", experts_ffn)),
        "num_experts": int(_field(reader, f"{arch}.expert_count")),
        "num_experts_per_tok": int(_field(reader, f"{arch}.expert_used_count")),
        "moe_intermediate_size": experts_ffn,
        "decoder_sparse_step": 1,
        "mlp_only_layers": _dense_layers(reader),
        "output_router_logits": False,
    }


def qwen3moe_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Qwen3MoeConfig` dict (Qwen3-30B-A3B's family) from GGUF metadata."""
    base = {**qwen3_config(_Renamed(reader, "qwen3moe", "qwen3")), "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe"}
    return {**_moe_config(reader, "qwen3moe", base), "norm_topk_prob": True}  # as Qwen3-MoE's checkpoints


def qwen2moe_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Qwen2MoeConfig` dict (with its shared expert) from GGUF metadata."""
    base = {**qwen2_config(_Renamed(reader, "qwen2moe", "qwen2")), "architectures": ["Qwen2MoeForCausalLM"],
            "model_type": "qwen2_moe"}
    shared = int(_field(reader, "qwen2moe.expert_shared_feed_forward_length", 0))
    return {**_moe_config(reader, "qwen2moe", base), "norm_topk_prob": False,
            "shared_expert_intermediate_size": shared}


def phi3_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Phi3Config` dict from GGUF metadata, as Microsoft's checkpoints write it:
    partial rotary (Phi-4-mini) from `rope.dimension_count`, LongRoPE from the factor tensors and the
    pretraining length, the sliding window (Phi-3-mini-4k; 0 is none, llama.cpp's mark of Phi-4)."""
    config = _shared_config(reader, "phi3")
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    window = int(_field(reader, "phi3.attention.sliding_window", 0))
    config = {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        **config,
        "eos_token_id": _end_tokens(reader, int(config["eos_token_id"]), PHI3_END_TOKENS),
        "original_max_position_embeddings": int(_field(reader, "phi3.rope.scaling.original_context_length",
                                                       config["max_position_embeddings"])),
        "partial_rotary_factor": int(_field(reader, "phi3.rope.dimension_count", head_dim)) / head_dim,
        "sliding_window": window or None,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    }
    factors = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1).tolist() for t in reader.tensors
               if t.name in PHI3_ROPE_FACTORS}
    if factors:
        if len(factors) != 2:
            raise ValueError(f"GGUF phi3: LongRoPE needs both {' and '.join(PHI3_ROPE_FACTORS)}; "
                             f"the file has only {next(iter(factors))}")
        scaling: dict[str, object] = {"rope_type": "longrope", "short_factor": factors[PHI3_ROPE_FACTORS[0]],
                                      "long_factor": factors[PHI3_ROPE_FACTORS[1]]}
        if "phi3.rope.scaling.attn_factor" in reader.fields:  # else transformers' default, as llama.cpp's
            scaling["attention_factor"] = float(_field(reader, "phi3.rope.scaling.attn_factor"))
        config["rope_scaling"] = scaling
    return config


# Phi-3's chat turns end with <|end|>, which llama.cpp stops at (an end-of-generation token by its
# text) and Microsoft's generation_config.json lists; the file's eos is <|endoftext|>.
PHI3_END_TOKENS = ("<|end|>", "<|endoftext|>")


def _end_tokens(reader: GGUFReader, eos: int, texts: tuple[str, ...]) -> int | list[int]:
    """The file's eos and the ids of the family's other end-of-generation tokens, by their text."""
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]  # type: ignore[union-attr]
    ends = sorted({eos, *(i for i, t in enumerate(tokens) if t in texts)})
    return ends if len(ends) > 1 else eos


def phi3_shards(config: dict[str, object]) -> dict[str, list[tuple[str, int]]]:
    """Phi-3's fused projections -> their parts' (Hugging Face name, rows), after "model.layers.N."."""
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    q, kv = int(config["num_attention_heads"]) * head_dim, int(config["num_key_value_heads"]) * head_dim
    ffn = int(config["intermediate_size"])
    return {"self_attn.qkv_proj.weight": [("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv),
                                          ("self_attn.v_proj.weight", kv)],
            "mlp.gate_up_proj.weight": [("mlp.gate_proj.weight", ffn), ("mlp.up_proj.weight", ffn)]}


def gpt_oss_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `GptOssConfig` dict from GGUF metadata: sliding-window layers first and
    then every other one (llama.cpp's pattern of 2), YaRN from the file's factor and pretraining
    length (betas and the SwiGLU clamp are what llama.cpp's gpt-oss graph fixes), biases, sinks."""
    arch = "gpt-oss"
    config = _shared_config(reader, arch)
    layers = int(config["num_hidden_layers"])
    scaling = str(_field(reader, f"{arch}.rope.scaling.type", "none"))
    if scaling not in ("yarn", "none"):
        raise ValueError(f"GGUF gpt-oss: RoPE scaling {scaling!r} is not gpt-oss's (yarn)")
    rope: dict[str, object] = {"rope_type": "default"} if scaling == "none" else {
        "rope_type": "yarn", "factor": float(_field(reader, f"{arch}.rope.scaling.factor")),
        "original_max_position_embeddings": int(_field(reader, f"{arch}.rope.scaling.original_context_length")),
        **GPT_OSS_YARN_BETAS}
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        **config,
        "head_dim": int(_field(reader, f"{arch}.attention.key_length")),
        "intermediate_size": int(_field(reader, f"{arch}.expert_feed_forward_length")),
        "num_local_experts": int(_field(reader, f"{arch}.expert_count")),
        "num_experts_per_tok": int(_field(reader, f"{arch}.expert_used_count")),
        "sliding_window": int(_field(reader, f"{arch}.attention.sliding_window")),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "rope_scaling": {**rope, "rope_theta": config["rope_theta"]},
        "eos_token_id": _end_tokens(reader, int(config["eos_token_id"]), GPT_OSS_END_TOKENS),
        "attention_bias": True,
        "hidden_act": "silu",
        **GPT_OSS_SWIGLU,
        "output_router_logits": False,
    }


class _Renamed:
    """A reader whose `<alias>.*` metadata keys read the `<arch>.*` ones (a MoE family's config is its
    dense sibling's plus the experts)."""

    def __init__(self, reader: GGUFReader, arch: str, alias: str) -> None:
        self.tensors = reader.tensors
        self.fields = {**reader.fields, **{alias + key[len(arch):]: value for key, value in reader.fields.items()
                                           if key.startswith(arch + ".")}}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one GGUF `general.architecture` maps onto a Hugging Face checkpoint."""

    config: Callable[[GGUFReader], dict[str, object]]
    layer_names: dict[str, str]
    norm_offset: float = 0.0  # added to every "*norm.weight" (Gemma stores 1 + w)
    # (reader, Hugging Face name, dequantized weight) -> the weight as Hugging Face lays it out
    transform: Callable[[GGUFReader, str, torch.Tensor], torch.Tensor] | None = None
    # config -> each fused tensor's parts (names after "model.layers.N.", rows): a fused tensor is
    # converted whole, and its quantized codes are kept as the parts' row slices (fused_shards)
    shards: Callable[[dict[str, object]], dict[str, list[tuple[str, int]]]] | None = None


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "gemma3": GGUFArchitecture(gemma3_config, _GEMMA3_LAYER_NAMES, norm_offset=-1.0),
    "qwen2": GGUFArchitecture(qwen2_config, _QWEN2_LAYER_NAMES),
    "llama": GGUFArchitecture(llama_config, _LLAMA_LAYER_NAMES, transform=unpermute_llama_qk),
    "qwen3": GGUFArchitecture(qwen3_config, _QWEN3_LAYER_NAMES),
    "qwen3moe": GGUFArchitecture(qwen3moe_config, _QWEN3MOE_LAYER_NAMES),
    "qwen2moe": GGUFArchitecture(qwen2moe_config, _QWEN2MOE_LAYER_NAMES),
    "phi3": GGUFArchitecture(phi3_config, _PHI3_LAYER_NAMES, shards=phi3_shards),
    "gpt-oss": GGUFArchitecture(gpt_oss_config, GPT_OSS_LAYER_NAMES, transform=gpt_oss_down_proj),
}
SUPPORTED_GGUF_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)


def hf_tensor_name(gguf_name: str, arch: str = "gemma3") -> str:
    """Map a GGUF tensor name of a model of architecture `arch` to its Hugging Face name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    layer_names = GGUF_ARCHITECTURES[arch].layer_names
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}"
    raise ValueError(f"unknown GGUF tensor name {gguf_name!r} for architecture {arch!r}")


def hf_config(reader: GGUFReader) -> dict[str, object]:
    """The Hugging Face config.json dict for the GGUF's own architecture."""
    return GGUF_ARCHITECTURES[gguf_architecture(reader)].config(reader)


def fused_shards(reader: GGUFReader) -> dict[str, list[tuple[str, int, int]]]:
    """The Hugging Face name of every fused tensor of the file -> its parts' (Hugging Face name,
    first row, end row). A fused projection's rows are its parts' rows stacked, and a quantized
    tensor's codes are stored a row at a time, so each part is a row slice of the codes as shipped:
    kept under the parts' names, they are what the block layers look up (runtime/cpu/block_linear.py
    serves qkv_proj from q_proj, k_proj and v_proj's codes, joined again)."""
    arch = gguf_architecture(reader)
    shards = GGUF_ARCHITECTURES[arch].shards
    if shards is None:
        return {}
    parts = shards(hf_config(reader))
    out: dict[str, list[tuple[str, int, int]]] = {}
    for tensor in reader.tensors:
        if tensor.name in CONFIG_TENSORS:
            continue
        name = hf_tensor_name(tensor.name, arch)
        layer, _, leaf = name.removeprefix("model.layers.").partition(".")
        if leaf not in parts:
            continue
        start, slices = 0, []
        for part, rows in parts[leaf]:
            slices.append((f"model.layers.{layer}.{part}", start, start + rows))
            start += rows
        if start != int(tensor.shape[-1]):  # GGUF lists the rows last
            raise ValueError(f"GGUF {tensor.name}: {int(tensor.shape[-1])} rows, but its parts "
                             f"{[p for p, _ in parts[leaf]]} have {start} by the file's metadata")
        out[name] = slices
    return out
