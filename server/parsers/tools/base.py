"""What every tool-call parser shares: the parse of a (possibly unfinished) text into content and
calls, and the streaming parser that turns successive parses into OpenAI-shaped deltas.

A format says two things (ToolParser subclasses): where a call block may open (`opening`, a
regex; a partial match at the end of the text is held back, never streamed as content) and how
to read a block that starts there (`read_block`). Everything else is shared, so the streamed
result is the non-streamed one by construction: `StreamingToolParser` parses the whole text so
far after every delta and sends only what the last parse added. That is sound because a parse
of a prefix never takes back anything: content is sent only once no opening can start inside it,
a call only once its name is known (and is one of the request's tools), and its arguments are the
raw text the model wrote, so what was sent is always a prefix of what follows.

Markup that turns out not to be a call (unknown name, not JSON, cut off before the name) stays
plain content: nothing is dropped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import ClassVar

import regex  # partial matches: an opening tag cut off at the end of the text so far


@dataclass
class CallDraft:
    """A call as far as the text goes: its arguments are JSON text (the model's own, as written)."""

    name: str
    arguments: str
    complete: bool = True


@dataclass
class Block:
    """What `read_block` found at an opening: calls (the last may be unfinished) and where the
    block ends (None: it runs past the end of the text so far)."""

    calls: list[CallDraft]
    end: int | None


PENDING = "pending"  # read_block: cannot tell yet whether this is a call
Segment = str | CallDraft


@dataclass
class Parsed:
    """Content and calls in the order the model wrote them."""

    segments: list[Segment] = field(default_factory=list)
    # Where a later parse may start over: everything before `checkpoint` is decided for good; of
    # the segments here, this many content characters and calls lie before it (a streamed parse
    # resumes there rather than at 0).
    checkpoint: int = 0
    content_before: int = 0
    calls_before: int = 0

    def settle(self, pos: int) -> None:
        self.checkpoint = pos
        self.content_before = sum(len(s) for s in self.segments if isinstance(s, str))
        self.calls_before = sum(1 for s in self.segments if isinstance(s, CallDraft))

    @property
    def content(self) -> str:
        return "".join(s for s in self.segments if isinstance(s, str))

    @property
    def calls(self) -> list[CallDraft]:
        return [s for s in self.segments if isinstance(s, CallDraft)]


@dataclass
class ToolSpec:
    name: str
    parameters: dict


class ToolParser:
    """One model family's tool-call format. Subclasses set the class attributes and read_block."""

    name: ClassVar[str]
    opening: ClassVar[str]  # regex where a call block may start
    trigger: ClassVar[str]  # the literal text that opens a call (what the grammar triggers on)
    # Markers that are special tokens in this family's vocabulary: kept in the text we parse.
    needs_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: list[ToolSpec] | None = None) -> None:
        self.tools = {t.name: t for t in tools or []}
        self._opening = regex.compile(self.opening)

    def known(self, name: str) -> bool:
        return not self.tools or name in self.tools

    def read_block(self, text: str, start: int, final: bool) -> Block | str | None:
        """The calls of the block opening at text[start]; PENDING when that cannot be told yet,
        None when it is not a call after all (its text is then content)."""
        raise NotImplementedError

    def parse(self, text: str, final: bool = True, start: int = 0) -> Parsed:
        """Content and calls of `text`; with final=False, text that may still become markup is left
        out (it is neither content nor a call yet). `start`: a checkpoint of an earlier parse of a
        prefix of `text` (what lies before it is not parsed again, nor returned)."""
        out = Parsed()
        out.settle(start)
        pos = start
        while True:
            m = self._opening.search(text, pos, partial=not final)
            if m is None:
                _content(out, text[pos:])
                out.settle(len(text))
                return out
            at = m.start()
            if m.partial:
                _content(out, text[pos:at])
                out.settle(at)
                return out
            block = self.read_block(text, at, final)
            if block is None or (block == PENDING and final):
                _content(out, text[pos:at + 1])  # not a call: its first character is content,
                pos = at + 1  # and the search goes on after it
                continue
            _content(out, text[pos:at])
            out.settle(at)
            if block == PENDING:
                return out
            assert isinstance(block, Block)
            out.segments.extend(block.calls)
            if block.end is None:
                return out
            pos = block.end
            out.settle(pos)

    # -- the grammar -----------------------------------------------------------------------------

    def call_tag(self, tool: ToolSpec, schema: dict) -> tuple[str, dict, str]:
        """(begin, schema, end): how the first call of a block is written around its arguments."""
        raise NotImplementedError

    separator: ClassVar[str] = "\n"  # between parallel calls
    block_open: ClassVar[str] = ""  # what only the first call of a block starts with (Mistral's "[TOOL_CALLS][")
    block_close: ClassVar[str] = ""  # what follows the last call of a block (Mistral's "]")
    constrained: ClassVar[bool] = True  # False: the grammar leaves the calls free
    # Python-call formats (pythonic, Gemma): how their blocks are written (python_grammar.PythonBlock);
    # the grammar is built from these instead of call_tag's JSON. `banned`: characters no string may hold.
    python_blocks: ClassVar[tuple] = ()
    banned: ClassVar[str] = ""


def _content(out: Parsed, text: str) -> None:
    if not text:
        return
    if out.segments and isinstance(out.segments[-1], str):
        out.segments[-1] += text
    else:
        out.segments.append(text)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ContentDelta:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    text: str


Event = ContentDelta | CallStart | ArgumentsDelta


class StreamingToolParser:
    """Feed it the model's text as it comes; it answers with what to send (content, a call's
    first delta, argument fragments). `prefix` is markup the prompt already holds (a template
    that ends its generation prompt with the opening tag): parsed, never sent as content."""

    def __init__(self, parser: ToolParser, prefix: str = "") -> None:
        self.parser = parser
        self.text = prefix
        self.checkpoint = (0, 0, 0)  # (position, content characters, calls) before it
        self.content_sent = 0
        self.leading = ""  # content that is only whitespace so far: sent once real text follows
        self.ids: list[str] = []
        self.args_sent: list[int] = []

    def feed(self, delta: str) -> list[Event]:
        self.text += delta
        return self._diff(self.parser.parse(self.text, final=False, start=self.checkpoint[0]))

    def finish(self) -> list[Event]:
        return self._diff(self.parser.parse(self.text, final=True, start=self.checkpoint[0]))

    def result(self) -> Parsed:
        return self.parser.parse(self.text, final=True)

    def _diff(self, parsed: Parsed) -> list[Event]:
        """What this parse adds to what was sent. Its segments start at the checkpoint it resumed from."""
        events: list[Event] = []
        _, seen, k = self.checkpoint
        for seg in parsed.segments:
            if isinstance(seg, str):
                new = seg[max(self.content_sent - seen, 0):]
                seen += len(seg)
                if new:
                    self.content_sent += len(new)
                    self._send_content(new, events)
                continue
            if k == len(self.ids):
                self.ids.append(new_call_id())
                self.args_sent.append(0)
                events.append(CallStart(k, self.ids[k], seg.name))
            if len(seg.arguments) > self.args_sent[k]:
                events.append(ArgumentsDelta(k, seg.arguments[self.args_sent[k]:]))
                self.args_sent[k] = len(seg.arguments)
            k += 1
        _, content, calls = self.checkpoint
        self.checkpoint = (parsed.checkpoint, content + parsed.content_before, calls + parsed.calls_before)
        return events

    def _send_content(self, text: str, events: list[Event]) -> None:
        if self.leading is not None:
            self.leading += text
            if not self.leading.strip():
                return
            text, self.leading = self.leading, None  # type: ignore[assignment]
        events.append(ContentDelta(text))
