"""This repository's `kernels` package and Hugging Face's of the same import name.

transformers 5.25 requires Hugging Face's `kernels`; installed, it shadowed ours wherever Python
started outside the checkout, and `python -m server` failed there (the Makefile's installs take it
out again: DROP_HUB_KERNELS). Inside a process, transformers is told that theirs is unavailable
wherever the name resolves to ours (runtime/loading/transformers_import.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runtime.loading.transformers_import import OURS, ours_shadow_theirs

ROOT = Path(__file__).resolve().parents[3]


def test_the_kernels_name_imports_ours_from_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell: the install alone
    run = subprocess.run([sys.executable, "-c", "import kernels, runtime.engine_args; print(kernels.__file__)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.strip()).resolve().parent == ROOT / "kernels" == OURS


def test_transformers_is_told_hub_kernels_are_unavailable_here() -> None:
    from transformers.utils import import_utils

    assert ours_shadow_theirs()
    assert not import_utils.is_kernels_available()  # tests/conftest.py called skip_hub_kernels_probe
    assert os.environ.get("USE_HUB_KERNELS", "").lower() in ("no", "0", "false", "off", "n")
