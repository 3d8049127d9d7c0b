"""Jump-forward decoding as exact speculation: a grammar's forced continuation, proposed as a draft.

Where a constraint allows only one continuation for a while (the keys and punctuation of a JSON
schema, a tool call's `{"name": "get_weather", "arguments": {`), xgrammar's matcher returns it as
text (`find_jump_forward_string`). That text, tokenized as the tokenizer tokenizes it, is a draft
like a prompt-lookup draft (runtime/sampling/speculative.py): one forward computes the request's
last token and the draft together, the logits at draft position i are masked by the grammar as it
stands after draft tokens 0..i-1 (`draft_matchers`), and the step keeps the draft's leading tokens
the model chose too, then the model's own token. So the output is what decoding one token at a time
gives, by construction. Where the forced text splits into other tokens than the model would choose
(`{"` against `{` then `"`), the draft is rejected at that position and the model's own token is
kept: the draft is a guess at the tokens, never text pushed into the output. (SGLang's original
jump-forward appended the text, and outputs changed at token boundaries; it was removed for that.)

The request's own matcher accepts only verified tokens (the output processor feeds them one at a
time, as for any decode): proposing checks a draft against it and rolls it back (`grammar_prefix`),
and masking walks forks of it, which are thrown away after the step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

# A forced run longer than this is drafted over several steps: each draft row costs a row of the
# output layer (large vocabularies make that the bulk of a small model's step), and a forced run's
# tail after a rejection would be wasted.
MAX_FORCED_TOKENS = 12


@dataclass
class JumpForward:
    """Proposes a constrained request's forced continuation as draft tokens."""

    tokenizer: object  # the Hugging Face tokenizer
    max_tokens: int = MAX_FORCED_TOKENS

    @classmethod
    def for_tokenizer(cls, hf_tokenizer: object | None) -> JumpForward | None:
        """None where there is no tokenizer (then there are no constraints either)."""
        if hf_tokenizer is None:
            return None
        return cls(hf_tokenizer)

    @functools.cached_property
    def encode(self) -> Callable[[str], list[int]]:
        """Text -> token ids, no special tokens added. Worked out on the first constrained request,
        not when the engine is built: encoding starts the tokenizer's own thread pool, and an
        engine that is never asked for a constraint should not have one."""
        return mid_text_encoder(self.tokenizer)

    def propose(self, matcher: object, limit: int) -> list[int]:
        """At most `limit` tokens of the forced continuation from the matcher's state: its text
        tokenized, cut where the grammar would refuse a token (a tokenizer that adds a prefix
        space, say). The matcher is left as it was."""
        limit = min(limit, self.max_tokens)
        if limit <= 0 or matcher.is_terminated():  # type: ignore[attr-defined]
            return []
        try:
            text = matcher.find_jump_forward_string()  # type: ignore[attr-defined]
        except UnicodeDecodeError:
            # Mid-character (the output so far ends inside a multi-byte character): xgrammar hands
            # back bytes that are no text. No draft; the grammar still masks each token.
            return []
        if not text:
            return []
        # Tokenize a little more than fits, so the last kept token is not a cut-off piece of a longer one.
        tokens = self.encode(text[: 8 * (limit + 1)])[:limit]
        return tokens[: grammar_prefix(matcher, tokens)]


def mid_text_encoder(hf_tokenizer: object) -> Callable[[str], list[int]]:
    """Text -> token ids as the text would be spelled in the middle of an output. SentencePiece
    tokenizers with a dummy prefix (Llama 2, Mistral, Phi-3) spell text at the start of an
    encoding with a leading space (`▁{`), which a grammar refuses: those encode after a newline
    and drop the newline's tokens."""
    def plain(text: str) -> list[int]:
        return hf_tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]

    pieces = hf_tokenizer.convert_ids_to_tokens(plain("{"))  # type: ignore[attr-defined]
    if not pieces or not str(pieces[0]).startswith("\u2581"):
        return plain
    sentinel = plain("\n")

    def after_newline(text: str) -> list[int]:
        ids = plain("\n" + text)
        return ids[len(sentinel):] if ids[: len(sentinel)] == sentinel else plain(text)

    return after_newline


def grammar_prefix(matcher: object, tokens: list[int]) -> int:
    """How many leading tokens the grammar accepts from the matcher's state; the state is restored."""
    n = 0
    for token in tokens:
        if matcher.is_terminated() or not matcher.accept_token(token):  # type: ignore[attr-defined]
            break
        n += 1
    if n:
        matcher.rollback(n)  # type: ignore[attr-defined]
    return n


def draft_matchers(matcher: object, draft: list[int]) -> list[object | None]:
    """One matcher per row of a draft being verified (len(draft) + 1 rows): row i's has accepted
    draft[:i], so its mask is the grammar's after them. Forks: the request's matcher is untouched.
    A row past a draft token the grammar refuses (or past its end) gets None, no mask: the draft is
    rejected at or before that token, so nothing sampled there is kept."""
    rows: list[object | None] = []
    walker = matcher.fork()  # type: ignore[attr-defined]
    for i in range(len(draft) + 1):
        if walker.is_terminated():
            break
        rows.append(walker.fork() if i < len(draft) else walker)
        if i < len(draft) and not walker.accept_token(draft[i]):
            break
    return rows + [None] * (len(draft) + 1 - len(rows))
