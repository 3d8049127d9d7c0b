"""A small byte-fallback BPE tokenizer (Gemma / Llama 2 style: `▁` for spaces, `<0x0F>` byte tokens).

The same size as tests/tiny_tokenizer.py's byte-level one (VOCAB_SIZE), so the tiny models
take either; built in-test with the `tokenizers` library, nothing from a hub.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_tokenizer import CHAT_TEMPLATE, VOCAB_SIZE

SPECIALS = ["<pad>", "<eos>", "<bos>"]
PIECES = ["▁", "a", "e", "t", "h", "n", "o", "s"]
MERGES = [("t", "h"), ("th", "e"), ("▁", "the"), ("a", "n"), ("▁", "a")]


def save_byte_fallback_tokenizer(folder: Path) -> None:
    """Write tokenizer files to `folder` (replacing any there): ids 0-2 specials, 3-258 the bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece in PIECES + [a + b for a, b in MERGES]:
        vocab[piece] = len(vocab)
    assert len(vocab) == VOCAB_SIZE, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, byte_fallback=True, unk_token=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
