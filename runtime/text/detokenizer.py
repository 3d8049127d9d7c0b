"""Incremental detokenization with stop strings and stop regexes.

Text grows only by whole characters: a token that ends mid-way through a multi-byte character
decodes to U+FFFD, so we wait for the next token (as vLLM does, decoding a short window of
recent tokens rather than the whole output each step). Stop strings may span tokens; text that
could still become a stop string (or a stop regex's match) is held back from streaming, and a
matched stop is cut, never returned, unless `no_stop_trim` (SGLang's flag) keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import regex  # the `regex` package: partial matches tell what to hold back while streaming

from runtime.text.tokenizer import Tokenizer

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output so leading spaces survive


@dataclass
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    prompt_tail: list[int]
    stop: list[str]
    skip_special_tokens: bool = True
    stop_regex: list[str] = field(default_factory=list)
    no_stop_trim: bool = False  # keep the matched stop string / regex match in the text
    text: str = ""
    sent: int = 0  # characters already streamed
    matched_stop: str | None = None
    _ids: list[int] = field(default_factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0

    def __post_init__(self) -> None:
        self._ids = list(self.prompt_tail[-CONTEXT_TOKENS:])
        self._read_offset = len(self._ids)
        self._patterns = [regex.compile(p) for p in self.stop_regex]

    def add(self, token_id: int, check_stops: bool = True) -> bool:
        """Append a token; True when a stop string or regex match has now appeared (the text is cut
        before it). check_stops=False (before min_new_tokens) appends without looking for stops;
        a later check finds only stops that end in text added since."""
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
            return check_stops and self._find_stop(searched)
        return False

    def _find_stop(self, searched: int) -> bool:
        """Look for the earliest stop that ends after text[:searched] (what earlier checks saw)."""
        best: tuple[int, str] | None = None
        for stop in self.stop:
            at = self.text.find(stop, max(0, searched - len(stop) + 1))
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        for pattern in self._patterns:
            for match in pattern.finditer(self.text):
                if match.end() > max(searched, match.start()):  # new, non-empty
                    if best is None or match.start() < best[0]:
                        best = (match.start(), pattern.pattern)
                    break
        if best is None:
            return False
        if not self.no_stop_trim:
            self.text = self.text[: best[0]]
        self.matched_stop = best[1]
        return True

    def flush(self) -> None:
        """At the end: whatever bytes are pending become text (a lone U+FFFD if truly invalid)."""
        if self.matched_stop is None and self._read_offset < len(self._ids):
            prefix = self.tokenizer.decode(self._ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
            full = self.tokenizer.decode(self._ids[self._prefix_offset :], self.skip_special_tokens)
            searched = len(self.text)
            self.text += full[len(prefix) :]
            self._read_offset = len(self._ids)
            self._find_stop(searched)  # (finished anyway: a stop found here only trims the text)

    def take_delta(self, final: bool) -> str:
        """New text safe to stream: held back while it could be the start of a stop string."""
        end = len(self.text) if final else len(self.text) - self._holdback()
        if end <= self.sent:
            return ""
        delta = self.text[self.sent : end]
        self.sent = end
        return delta

    def _holdback(self) -> int:
        if self.no_stop_trim:
            return 0  # nothing streamed is ever cut
        longest = 0
        for pattern in self._patterns:  # a match in progress reaches the end of the text
            for match in pattern.finditer(self.text, self.sent, partial=True):
                if match.partial:
                    longest = max(longest, len(self.text) - match.start())
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
