"""A GGUF's tokenizer, as `transformers` rebuilds it from the file's vocabulary, in seconds.

`AutoTokenizer.from_pretrained(folder, gguf_file=name)` first builds the model's whole config
from the file, only to pick the tokenizer class from its `model_type`; for the families we
convert, that runs transformers' legacy GGUF reader over every value of the header (the
vocabulary and merges one numpy view at a time): 60 seconds of a 7B file's first use, 16 of a
1B's. The tokenizer class itself reads the vocabulary with transformers' fast GGUF reader. So the
class is picked here the way AutoTokenizer picks it (the architecture renamed as
transformers' GGUF loader renames it, then its tokenizer mapping), and that class builds the
tokenizer: the same tokenizer, the same files saved (tests/runtime/loading/test_gguf_first_use.py
checks both ways against each other for every family).
"""

from __future__ import annotations

from pathlib import Path

# transformers' GGUF loader (modeling_gguf_pytorch_utils.load_gguf_checkpoint) names these
# architectures' configs so; the others keep the architecture's name.
_MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}


def transformers_model_type(architecture: str, name: object) -> str:
    """The `model_type` of the config transformers builds from a GGUF of this architecture and
    `general.name` (a Llama-architecture file named exactly "mistral" is Mistral to it)."""
    if architecture == "llama" and name == "mistral":
        return "mistral"
    return _MODEL_TYPES.get(architecture, architecture)


def tokenizer_class(model_type: str) -> type:
    """The class AutoTokenizer instantiates for a GGUF whose config has this `model_type` (with no
    tokenizer_config.json beside the file)."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    # By name: TOKENIZER_MAPPING keyed by the config class is the same table, but importing the
    # config's module costs seconds (transformers' kernel probes).
    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    chosen = tokenizer_class_from_name(name) if name else None
    if chosen is None or chosen.__name__ == "MistralCommonBackend":  # a GGUF carries no Mistral-format files
        return TokenizersBackend
    return chosen


def gguf_tokenizer(gguf_path: Path, architecture: str, name: object = None) -> object:
    """The tokenizer `AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)` gives."""
    cls = tokenizer_class(transformers_model_type(architecture, name))
    return cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)  # type: ignore[attr-defined]
