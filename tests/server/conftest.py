from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Engine
from tests.server.harness import RunningServer, serve
from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("server-llama"))


@pytest.fixture(scope="module")
def server(tiny_folder: Path) -> Iterator[RunningServer]:
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=4096) as engine:
        with serve(engine, served_model_name="tiny") as running:
            yield running
