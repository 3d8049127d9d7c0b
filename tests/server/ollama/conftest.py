from __future__ import annotations

from collections.abc import Iterator

import ollama
import pytest

from runtime import Engine
from tests.server.anthropic.helpers import save_tools_model
from tests.server.harness import RunningServer, serve


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = save_tools_model(tmp_path_factory.mktemp("tools-model"), context=2048)
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=8192) as engine:
        with serve(engine, served_model_name="tiny") as running:
            yield running


@pytest.fixture(scope="module")
def client(tools_server: RunningServer) -> ollama.Client:
    return ollama.Client(host=tools_server.url)
