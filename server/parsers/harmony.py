"""The harmony format (gpt-oss) read from the model's text: its messages, their channels and
recipients. The reasoning parser (reasoning.py, `gpt_oss`) and the tool-call parser
(tools/harmony.py) both read through here.

A completion continues a prompt that ends `<|start|>assistant`, so it reads

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer...<|return|>

or, calling a function, `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
(the recipient may also follow the role: `<|start|>assistant to=functions.NAME<|channel|>commentary
json<|message|>`). The markers are special tokens, so the text is decoded with them kept. `analysis`
is reasoning, `final` and recipient-less `commentary` (a preamble) are content, a message to
`functions.*` is a call. The `openai-harmony` package is not used: it reads token ids of its own
encoding, whose vocabulary it downloads on first use (no network here), while our parsers read text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
FUNCTIONS = "functions."
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([\w-]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


@dataclass
class Message:
    """One message as far as the text goes; `channel` None for text outside any message."""

    channel: str | None
    recipient: str | None
    body: str
    closed: bool  # its end marker has been read

    @property
    def function(self) -> str | None:
        """The function it calls (`to=functions.NAME`), else None."""
        if self.recipient is not None and self.recipient.startswith(FUNCTIONS):
            return self.recipient[len(FUNCTIONS):]
        return None


def held_back(text: str) -> int:
    """How many characters at the end of `text` may be the start of a marker (kept back while streaming)."""
    for n in range(min(len(text), max(map(len, MARKERS)) - 1), 0, -1):
        if any(marker.startswith(text[-n:]) for marker in MARKERS):
            return n
    return 0


def header_at(text: str, start: int) -> tuple[str | None, str | None, int] | None:
    """(channel, recipient, where the body starts) of the message whose header starts at `start`;
    None while the header runs past the end of the text, or is broken by another message's marker."""
    at = text.find(MESSAGE, start)
    if at < 0:
        return None
    header = text[start:at]
    if END in header or START in header[len(START):]:
        return None
    channel, recipient = _CHANNEL_NAME.search(header), _RECIPIENT.search(header)
    return (channel.group(1) if channel else None, recipient.group(1) if recipient else None, at + len(MESSAGE))


def body_end(text: str, start: int) -> tuple[int, int] | None:
    """(where the body starting at `start` ends, where the next message may start), or None while it is open."""
    ends = [(at, len(marker)) for marker in (END, CALL, RETURN) if (at := text.find(marker, start)) >= 0]
    nxt = text.find(START, start)
    if nxt >= 0:
        ends.append((nxt, 0))
    if not ends:
        return None
    at, skip = min(ends)
    return at, at + skip


def messages(text: str, final: bool) -> list[Message]:
    """The messages of `text` in order. Not final: an unfinished header is left out and a possible
    partial marker at the end is held back, so what is returned only ever grows."""
    out: list[Message] = []
    pos = 0
    if not final and "to=".startswith(text.lstrip(" ")):
        return out  # nothing yet, or what may become the first message's ` to=` (its role's recipient)
    while pos < len(text):
        if not _opens(text, pos):  # text outside any message, up to the next one
            nxt = min((at for m in (START, CHANNEL) if (at := text.find(m, pos)) >= 0), default=len(text))
            stop = nxt if nxt < len(text) or final else len(text) - held_back(text)
            if stop > pos:
                out.append(Message(None, None, text[pos:stop], nxt < len(text)))
            if nxt == len(text):
                break
            pos = nxt
            continue
        header = header_at(text, pos)
        if header is None:
            if final:
                out.append(Message(None, None, text[pos:], True))
            break
        channel, recipient, body = header
        ends = body_end(text, body)
        if ends is None:
            stop = len(text) if final else len(text) - held_back(text)
            out.append(Message(channel, recipient, text[body:max(body, stop)], False))
            break
        out.append(Message(channel, recipient, text[body:ends[0]], True))
        pos = ends[1]
    return out


def _opens(text: str, pos: int) -> bool:
    """Whether a message's header starts at `pos` (the first may continue the prompt's role: ` to=...`)."""
    return text.startswith((START, CHANNEL), pos) or (pos == 0 and text.lstrip(" ").startswith("to="))


def call_markup(function: str) -> str:
    """How a call's header is handed on to the tool-call parser, whatever form the model wrote."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{function}{MESSAGE}"
