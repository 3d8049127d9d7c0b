"""Test-wide settings."""

from __future__ import annotations

import os

import torch

# Without a GPU, Triton kernels run under Triton's interpreter; with one (`make test-gpu`) they
# run compiled. It must be decided before any kernel is defined, so before test modules import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
