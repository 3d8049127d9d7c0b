"""Test-wide settings."""

from __future__ import annotations

import os

# No GPU here: Triton kernels run under Triton's interpreter. It must be on before any kernel is
# defined, so it is set before test modules import anything.
os.environ.setdefault("TRITON_INTERPRET", "1")
