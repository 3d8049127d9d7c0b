"""Fixtures the loading tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.loading.default_model import radixserve_home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A RADIXSERVE_HOME of the test's own, which shares the fused CPU kernels already built (a server
    process started with it would otherwise build them again)."""
    built = radixserve_home() / "cpu-ops"
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    if built.is_dir():
        (tmp_path / "home" / "cpu-ops").symlink_to(built)
    return tmp_path / "home"
