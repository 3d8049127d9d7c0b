"""Convert a Gemma 3 GGUF file into a Hugging Face-style folder (config, safetensors, tokenizer).

Weights are dequantized with `gguf.quants.dequantize` and renamed to Hugging Face names;
the tokenizer is rebuilt by `transformers` from the GGUF's vocabulary. The result loads like
any other checkpoint, with our model code or with `transformers`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

logger = logging.getLogger(__name__)

SUPPORTED_GGUF_ARCHITECTURES = ("gemma3",)

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores (1 + w), so we subtract 1.
_GEMMA_NORM_SUFFIX = "norm.weight"
# Gemma 3's local (sliding-window) layers use this RoPE base; the GGUF does not record it.
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6


def hf_tensor_name(gguf_name: str) -> str:
    """Map a GGUF tensor name of a Gemma 3 model to its Hugging Face name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ValueError(f"unknown GGUF tensor name {gguf_name!r}")


def _field(reader: GGUFReader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF file lacks the metadata key {key!r}")
        return default
    return field.contents()


def gemma3_config(reader: GGUFReader) -> dict[str, object]:
    """Build a Hugging Face `Gemma3TextConfig` dict from GGUF metadata."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_GGUF_ARCHITECTURES}"
        )
    num_layers = int(_field(reader, "gemma3.block_count"))
    head_dim = int(_field(reader, "gemma3.attention.key_length"))
    vocab_size = len(reader.fields["tokenizer.ggml.tokens"].data)
    layer_types = [
        "full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": vocab_size,
        "hidden_size": int(_field(reader, "gemma3.embedding_length")),
        "intermediate_size": int(_field(reader, "gemma3.feed_forward_length")),
        "num_hidden_layers": num_layers,
        "num_attention_heads": int(_field(reader, "gemma3.attention.head_count")),
        "num_key_value_heads": int(_field(reader, "gemma3.attention.head_count_kv")),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "rms_norm_eps": float(_field(reader, "gemma3.attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(_field(reader, "gemma3.context_length")),
        "sliding_window": int(_field(reader, "gemma3.attention.sliding_window")),
        "layer_types": layer_types,
        "rope_theta": float(_field(reader, "gemma3.rope.freq_base")),
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
        "rope_scaling": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "tie_word_embeddings": "output.weight" not in {t.name for t in reader.tensors},
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        "torch_dtype": "float32",
    }


def dequantized_state_dict(
    reader: GGUFReader, dtype: torch.dtype = torch.float32, progress: bool = True
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of the GGUF into a Hugging Face-named state dict."""
    state: dict[str, torch.Tensor] = {}
    for tensor in tqdm(reader.tensors, desc="dequantizing", unit="tensor", disable=not progress):
        # GGUF records shapes fastest-dimension first; numpy wants them reversed.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        weight = torch.from_numpy(array)
        name = hf_tensor_name(tensor.name)
        if name.endswith(_GEMMA_NORM_SUFFIX):
            weight = weight - 1.0
        state[name] = weight.to(dtype).contiguous()
    return state


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    chat_template: str | None = None,
    generation_config: dict[str, object] | None = None,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
) -> Path:
    """Write config.json, model.safetensors and tokenizer files for `gguf_path` into `out_dir`."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(gguf_path))
    config = gemma3_config(reader)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    log(f"dequantizing {gguf_path.name} into {out_dir}")
    state = dequantized_state_dict(reader, dtype=dtype, progress=progress)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del state
    log("building the tokenizer from the GGUF vocabulary (about 30 s for a 262k vocabulary)")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if generation_config is not None:
        (out_dir / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    return out_dir
