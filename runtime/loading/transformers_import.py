"""transformers' model code imported without its probe for Hugging Face's `kernels` package.

As it imports a model's configuration, transformers asks whether Hugging Face's `kernels` package
is installed, by that import name. This repository's own `kernels` package (our CPU and GPU
kernels) answers the import but has no distribution of that name, so transformers then maps every
installed distribution's files to their import names looking for one: 0.6 s of every start (a 1B
GGUF's whole start-up is 4 s), to learn that the package is not theirs. Where no distribution
named `kernels` is installed the answer is known, and transformers is told it first.
"""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def skip_hub_kernels_probe() -> None:
    """Call before transformers imports a model's configuration or tokenizer code."""
    try:
        importlib.metadata.version("kernels")
        return  # Hugging Face's kernels is installed: transformers' own answer is the right one
    except importlib.metadata.PackageNotFoundError:
        pass
    from transformers import utils
    from transformers.utils import import_utils

    def unavailable(*args: object, **kwargs: object) -> bool:
        return False

    import_utils.is_kernels_available = utils.is_kernels_available = unavailable  # type: ignore[assignment]
