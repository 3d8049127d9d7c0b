"""The table of request fields that docs/apis.md shows: for /v1/chat/completions, /v1/completions
and /v1/responses, every field their request Structs declare, whose it is (OpenAI, vLLM,
SGLang), and whether it is accepted, accepted and ignored, or refused when set. Generated from
the code's own lists (server/pipeline/fields.py, server/openai/fields.py,
server/responses/fields.py), so it cannot drift: tests/server/test_field_table.py compares.

    python -m server.field_table            # print the table
    python -m server.field_table --write    # put it into docs/apis.md between its markers
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import msgspec

from server.openai.fields import COMPLETION_IGNORED, COMPLETION_ORIGIN, COMPLETION_REFUSED
from server.openai.protocol import CompletionRequest
from server.pipeline.fields import IGNORED, ORIGIN, REFUSED
from server.pipeline.request import ChatCompletionRequest
from server.responses.fields import RESPONSES_IGNORED, RESPONSES_ORIGIN, RESPONSES_REFUSED
from server.responses.protocol import ResponsesRequest

DOC = Path(__file__).resolve().parent.parent / "docs" / "apis.md"
START, END = "<!-- fields:start (python -m server.field_table --write) -->", "<!-- fields:end -->"
ORDER = ["OpenAI", "vLLM, SGLang", "vLLM", "SGLang"]


@dataclass
class Route:
    path: str
    struct: type
    origin: dict[str, str]
    ignored: dict[str, str]
    refused: dict[str, str]

    def fields(self) -> list[str]:
        return [f.name for f in msgspec.structs.fields(self.struct)]

    def status(self, name: str) -> str:
        if name not in self.fields():
            return "-"
        return "refused" if name in self.refused else "ignored" if name in self.ignored else "accepted"


def routes() -> list[Route]:
    return [
        Route("/v1/chat/completions", ChatCompletionRequest, ORIGIN, IGNORED, REFUSED),
        Route("/v1/completions", CompletionRequest, {**ORIGIN, **COMPLETION_ORIGIN},
              {**IGNORED, **COMPLETION_IGNORED}, {**REFUSED, **COMPLETION_REFUSED}),
        Route("/v1/responses", ResponsesRequest, RESPONSES_ORIGIN, RESPONSES_IGNORED, RESPONSES_REFUSED),
    ]


def field_table() -> str:
    table = routes()
    names = {n for r in table for n in r.fields()}
    rows = []
    for name in names:
        origins = [r.origin[name] for r in table if name in r.fields()]
        notes = []
        for r in table:
            why = r.ignored.get(name) or r.refused.get(name)
            if why and why not in notes:
                notes.append(why)
        rows.append((ORDER.index(origins[0]), name, origins[0], [r.status(name) for r in table], "; ".join(notes)))
    lines = ["| field | from | " + " | ".join(f"`{r.path}`" for r in table) + " | why ignored or refused |",
             "|---|---|" + "---|" * len(table) + "---|"]
    for _, name, origin, statuses, note in sorted(rows):
        lines.append(f"| `{name}` | {origin} | " + " | ".join(statuses) + f" | {note} |")
    return "\n".join(lines) + "\n"


def written(doc: str) -> str:
    """docs/apis.md with the table between its markers replaced by a fresh one."""
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{field_table()}{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the table into {DOC}")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(written(DOC.read_text()))
    else:
        print(field_table(), end="")


if __name__ == "__main__":
    main()
