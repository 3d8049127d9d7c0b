"""transformers' model code imported without its probe for Hugging Face's `kernels` package.

As it imports a model's code, transformers asks whether Hugging Face's `kernels` package is
installed, by that import name, and where it says yes imports hub kernels from it. In this
process `import kernels` is this repository's own package (our CPU and GPU kernels), which
shadows theirs whatever is installed:
- where no distribution named `kernels` is installed, transformers maps every installed
  distribution's files to their import names looking for one: 0.6 s of every start (a 1B GGUF's
  whole start-up is 4 s), to learn that the package is not theirs;
- where one is (transformers 5.25 requires it), transformers imports its names from ours and
  every model import fails (`cannot import name 'CUDAProperties' from 'kernels'`).
So wherever `kernels` resolves to ours, transformers is told first that theirs is unavailable,
and that hub kernels are off (USE_HUB_KERNELS, unless set: 5.25's from_pretrained asks for them by
default and refuses to load where the package is unavailable).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

OURS = Path(__file__).resolve().parents[2] / "kernels"  # this repository's kernels package


def ours_shadow_theirs() -> bool:
    """Whether `import kernels` gives this repository's package, not Hugging Face's."""
    spec = importlib.util.find_spec("kernels")
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent == OURS


@functools.cache
def skip_hub_kernels_probe() -> None:
    """Call before transformers imports a model's configuration, model or tokenizer code."""
    if not ours_shadow_theirs():
        return  # Hugging Face's kernels is what the name imports: transformers' own answer is the right one
    os.environ.setdefault("USE_HUB_KERNELS", "NO")
    from transformers import utils
    from transformers.utils import import_utils

    def unavailable(*args: object, **kwargs: object) -> bool:
        return False

    import_utils.is_kernels_available = utils.is_kernels_available = unavailable  # type: ignore[assignment]
