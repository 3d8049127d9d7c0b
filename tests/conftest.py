"""Test-wide settings."""

from __future__ import annotations

import os

import torch

# Without a GPU, Triton kernels run under Triton's interpreter; with one (`make test-gpu`) they
# run compiled. It must be decided before any kernel is defined, so before test modules import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests import transformers' model code directly (parity references): it must not take this
# repository's `kernels` package for Hugging Face's (runtime/loading/transformers_import.py).
from runtime.loading.transformers_import import skip_hub_kernels_probe  # noqa: E402

skip_hub_kernels_probe()
