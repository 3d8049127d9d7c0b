"""The vocabulary a grammar sees: each token as the text the detokenizer will return for it.

xgrammar builds its token table from the tokenizer's vocabulary (byte-level tokens such as `Ġ`
and byte-fallback tokens such as `<0x0F>` decoded back to bytes, padding ids past the
tokenizer's size left empty). It reads special tokens (`<pad>`, `<bos>`, Llama 3's
`<|reserved_special_token_0|>`...) as their literal text, so a JSON string may contain
`<pad>` as far as the grammar knows; but the detokenizer drops them under
`skip_special_tokens` (the default), and the client gets other text than the grammar accepted
(a `minLength` string that is empty, say). With `skip_special_tokens` those tokens are blanked
in the table, which xgrammar treats as special: never allowed by any grammar (stop tokens stay
allowed where the grammar may end). Without it they are text, as the detokenizer writes them.
"""

from __future__ import annotations


def special_token_ids(hf_tokenizer: object) -> set[int]:
    """The ids `decode(..., skip_special_tokens=True)` leaves out."""
    ids = set(getattr(hf_tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(hf_tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def tokenizer_info(hf_tokenizer: object, vocab_size: int, stop_token_ids: list[int],
                   skip_special_tokens: bool) -> object:
    """An xgrammar TokenizerInfo whose table matches the detokenizer's text (see the module doc)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    hidden = special_token_ids(hf_tokenizer) - set(stop_token_ids) if skip_special_tokens else set()
    hidden = {i for i in hidden if 0 <= i < vocab_size}
    if not hidden:
        return info
    vocab = [""] * vocab_size
    for token, token_id in hf_tokenizer.get_vocab().items():  # type: ignore[attr-defined]
        if token_id < vocab_size and token_id not in hidden:
            vocab[token_id] = token
    return xgr.TokenizerInfo(vocab, info.vocab_type, vocab_size=vocab_size, stop_token_ids=stop_token_ids,
                             add_prefix_space=info.add_prefix_space)
