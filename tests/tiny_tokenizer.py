"""A small byte-level BPE tokenizer (every UTF-8 text encodes) with a chat template, for tiny models."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
SPECIALS = ["<pad>", "<eos>", "<bos>"]
MERGES = [("t", "h"), ("h", "e"), ("th", "e"), ("a", "n"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("o", "n"),
          ("Ġ", "a"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at")]
VOCAB_SIZE = 3 + 256 + len(MERGES)  # 271


def save_tiny_tokenizer(folder: Path, bos: bool = True) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                           special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["add_bos_token"] = bos
    config_path.write_text(json.dumps(config, indent=2))
