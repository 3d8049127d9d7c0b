"""Incremental detokenization with stop strings.

Text grows only by whole characters: a token that ends mid-way through a multi-byte character
decodes to U+FFFD, so we wait for the next token (as vLLM does, decoding a short window of
recent tokens rather than the whole output each step). Stop strings may span tokens; text that
could still become a stop string is held back from streaming, and a matched stop string is cut,
never returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.tokenizer import Tokenizer

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output so leading spaces survive


@dataclass
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    prompt_tail: list[int]
    stop: list[str]
    skip_special_tokens: bool = True
    text: str = ""
    sent: int = 0  # characters already streamed
    matched_stop: str | None = None
    _ids: list[int] = field(default_factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0

    def __post_init__(self) -> None:
        self._ids = list(self.prompt_tail[-CONTEXT_TOKENS:])
        self._read_offset = len(self._ids)
        self._max_stop = max((len(s) for s in self.stop), default=0)

    def add(self, token_id: int) -> bool:
        """Append a token; True when a stop string has now appeared (the text is cut before it)."""
        if self.matched_stop is not None:
            return True
        self._ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        full = decode(self._ids[self._prefix_offset :], self.skip_special_tokens)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            searched = len(self.text)
            self.text += full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return self._find_stop(max(0, searched - self._max_stop + 1))
        return False

    def _find_stop(self, start: int) -> bool:
        best: tuple[int, str] | None = None
        for stop in self.stop:
            at = self.text.find(stop, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return False
        self.text = self.text[: best[0]]
        self.matched_stop = best[1]
        return True

    def flush(self) -> None:
        """At the end: whatever bytes are pending become text (a lone U+FFFD if truly invalid)."""
        if self.matched_stop is None and self._read_offset < len(self._ids):
            prefix = self.tokenizer.decode(self._ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
            full = self.tokenizer.decode(self._ids[self._prefix_offset :], self.skip_special_tokens)
            self.text += full[len(prefix) :]
            self._read_offset = len(self._ids)
            self._find_stop(0)

    def take_delta(self, final: bool) -> str:
        """New text safe to stream: held back while it could be the start of a stop string."""
        end = len(self.text) if final else len(self.text) - self._holdback()
        if end <= self.sent:
            return ""
        delta = self.text[self.sent : end]
        self.sent = end
        return delta

    def _holdback(self) -> int:
        longest = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
