"""What ended a choice's text, in the peers' two names beside OpenAI's finish_reason.

- SGLang's `matched_stop`: the stop string, the stop_regex pattern, or the token id (a stop
  token, EOS, or the token that closed an output constraint) that ended it; null when it ran to
  its length or was aborted.
- vLLM's `stop_reason`: the stop string or stop token id the request asked for that ended it;
  null otherwise, EOS included (and here also a chat template's own end-of-turn string).
"""

from __future__ import annotations

from runtime import Output
from server.pipeline.request import SamplingFields


def asked_stops(body: SamplingFields) -> set[str | int]:
    """The stops the request itself gave: stop strings, stop_regex patterns, stop token ids."""
    stops: set[str | int] = set()
    for field in (body.stop, body.stop_regex):
        stops.update([field] if isinstance(field, str) else field or [])
    stops.update(body.stop_token_ids or [])
    return stops


def stop_fields(out: Output, asked: set[str | int]) -> tuple[str | int | None, str | int | None]:
    """(matched_stop, stop_reason) of a finished output."""
    if out.finish_reason != "stop" or out.matched_stop is None:
        return None, None
    matched = out.matched_stop
    return matched, matched if matched in asked else None
