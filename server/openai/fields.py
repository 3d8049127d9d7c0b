"""The fields only /v1/completions has (its request also takes every shared field sorted in
server/pipeline/fields.py): whose they are, and which are refused when set. docs/apis.md's table
is generated from these lists (server/field_table.py)."""

from __future__ import annotations

from server.pipeline.fields import OPENAI

COMPLETION_ORIGIN: dict[str, str] = {"prompt": OPENAI, "logprobs": OPENAI, "echo": OPENAI, "suffix": OPENAI,
                                     "best_of": OPENAI}
COMPLETION_IGNORED: dict[str, str] = {}
COMPLETION_REFUSED: dict[str, str] = {
    "suffix": "suffix is not supported: no fill-in-the-middle prompt format is known for the served model; "
              "put the text after the gap in the prompt instead",
}
