"""docs/apis.md's table of request fields is the code's own (issue #41): every declared field of the
OpenAI-shaped routes is sorted in the lists, the table in the docs is what server.field_table
generates from them, and the server does what the lists say: every refused field, set, is a 400
naming it; every ignored one is no error."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from server.field_table import DOC, field_table, routes, written
from server.openai.fields import COMPLETION_ORIGIN
from server.openai.protocol import CompletionRequest
from tests.server.harness import RunningServer

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
}


def test_every_field_is_sorted() -> None:
    for route in routes():
        fields = set(route.fields())
        assert fields <= set(route.origin), f"{route.path}: fields without an origin: {fields - set(route.origin)}"
        if route.path != "/v1/completions":  # its lists are the chat route's (a superset) and its own
            assert set(route.origin) <= fields, f"{route.path}: stale names {set(route.origin) - fields}"
        assert set(route.ignored) <= set(route.origin) and set(route.refused) <= set(route.origin), route.path
        assert not set(route.ignored) & set(route.refused), route.path
    assert set(COMPLETION_ORIGIN) <= {f.name for f in msgspec.structs.fields(CompletionRequest)}


def test_the_docs_table_is_generated() -> None:
    doc = DOC.read_text()
    assert written(doc) == doc, "docs/apis.md's table is stale: run python -m server.field_table --write"
    assert field_table() in doc


def _set_value(struct: type, name: str) -> object:
    """A value that asks for the field's feature, of the type the Struct decodes."""
    (field,) = [f for f in msgspec.structs.fields(struct) if f.name == name]
    kind = str(field.type)
    if "dict" in kind:
        return {"1": 1.0}
    if "list" in kind:
        return [{"name": "f"}] if name == "functions" else ["x"]
    if "int" in kind:
        return 1
    if "str" in kind:
        return "x"
    return True


def _cases(kind: str) -> list[tuple[str, str]]:
    return [(r.path, name) for r in routes() for name in getattr(r, kind) if name in r.fields()]


@pytest.mark.parametrize(("path", "name"), _cases("refused"))
def test_refused_fields_are_400s_naming_them(server: RunningServer, path: str, name: str) -> None:
    struct = next(r.struct for r in routes() if r.path == path)
    resp = httpx.post(server.url + path, json={"model": "tiny", **BODIES[path], name: _set_value(struct, name)},
                      timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == name and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "name"), _cases("ignored"))
def test_ignored_fields_are_no_error(server: RunningServer, path: str, name: str) -> None:
    struct = next(r.struct for r in routes() if r.path == path)
    resp = httpx.post(server.url + path, json={"model": "tiny", **BODIES[path], name: _set_value(struct, name)},
                      timeout=60)
    assert resp.status_code == 200, resp.text
