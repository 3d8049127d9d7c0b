"""Logprobs in OpenAI's two shapes: the legacy Completions one (tokens, token_logprobs,
top_logprobs, text_offset; with `echo` the prompt's tokens come first, the very first with a null
logprob, as OpenAI and vLLM answer) and Chat Completions' `content` list.

A streamed completion sends each chunk the entries its tokens added: `LogprobCursor` remembers
how many entries of a choice went out and where their text ended. A streamed Output's `logprobs`
may already hold entries of later tokens (the engine appends to the same lists), so a chunk takes
entries only up to the tokens that Output counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime import Output
from server.common.state import ServerState
from server.openai.protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprobEntry, TopLogprob

Entry = tuple[float | None, int, list[tuple[float, int]] | None]  # (logprob, token, top alternatives)


def entries(out: Output, echo: bool) -> list[Entry]:
    """The output's logprob entries: with echo, the prompt's first, then the completion's, as far
    as this Output's tokens go."""
    lp = out.logprobs
    if lp is None:
        return []
    found: list[Entry] = []
    if echo:
        for i, (value, token) in enumerate(lp.input_token_logprobs[:out.prompt_tokens]):
            top = lp.input_top_logprobs[i] if i < len(lp.input_top_logprobs) else None
            found.append((value, token, top))
    for i, (value, token) in enumerate(lp.output_token_logprobs[:out.completion_tokens]):
        top = lp.output_top_logprobs[i] if i < len(lp.output_top_logprobs) else None
        found.append((value, token, top))
    return found


def completion_logprobs(state: ServerState, found: list[Entry], offset: int = 0) -> CompletionLogprobs:
    """Entries in the Completions shape; `offset`: where the first token's text starts in the
    choice's text (a streamed chunk's entries go on from the last chunk's)."""
    tokens = [state.token_text(t) for _, t, _ in found]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops = [{state.token_text(t): v for v, t in top} if top else None for _, _, top in found]
    return CompletionLogprobs(tokens=tokens, token_logprobs=[v for v, _, _ in found], top_logprobs=tops,
                              text_offset=offsets)


@dataclass
class LogprobCursor:
    """One streamed choice: how many entries were sent, and where their text ends."""

    sent: int = 0
    offset: int = 0

    def take(self, state: ServerState, out: Output, echo: bool) -> CompletionLogprobs:
        new = entries(out, echo)[self.sent:]
        self.sent += len(new)
        shaped = completion_logprobs(state, new, self.offset)
        self.offset += sum(len(t) for t in shaped.tokens)
        return shaped


def chat_logprobs(state: ServerState, out: Output) -> ChoiceLogprobs:
    content = []
    for value, token, top in entries(out, echo=False):
        text = state.token_text(token)
        content.append(TokenLogprobEntry(token=text, logprob=value, bytes=list(text.encode()),  # type: ignore[arg-type]
                                         top_logprobs=[TopLogprob(state.token_text(t), v,
                                                                  list(state.token_text(t).encode()))
                                                       for v, t in top or []]))
    return ChoiceLogprobs(content=content)
