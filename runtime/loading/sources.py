"""Where a model comes from: `--model` resolved once into a folder the runner loads.

The forms, tried in this order:
- `default` or a built-in model's name or alias (runtime/loading/builtin_models.py);
- `ollama:NAME[:TAG]`: the GGUF blob that Ollama's own store already holds (`$OLLAMA_MODELS`, else
  `~/.ollama/models`): the manifest `manifests/registry.ollama.ai/library/NAME/TAG` (a
  `user/name` model lives under `user/` instead of `library/`) names the layer of media type
  `application/vnd.ollama.image.model`, whose digest `sha256:X` is the file `blobs/sha256-X`;
- a `.gguf` file, or the first part of a split one (`-00001-of-0000N.gguf`: runtime/loading/gguf_split.py);
- a local folder with a `config.json` (a Hugging Face checkpoint);
- a Hugging Face id `org/repo`, through `huggingface_hub` as vLLM's and SGLang's users expect:
  its cache first, downloaded where the network allows (`HF_HUB_OFFLINE=1`: the cache only); a
  repository of GGUF files needs `--gguf-file NAME`.
A GGUF (from a path, Ollama or the hub) is read once into `$RADIXSERVE_HOME/models/gguf/`,
keyed by the file's path, size and modification time: its config, its tokenizer and chat template
from the file's own metadata, its 5-8-bit tensors as their codes, the few others (norms)
dequantized, and where its 4-bit ones lie in the file, which is read again at every load
(runtime/loading/gguf_convert.py, full=False; runtime/loading/gguf_refs.py): seconds, a fraction
of the file's size, served from the codes (runtime/cpu/block_linear.py). A conversion that did
not finish, or a folder whose files are not the sizes its manifest lists, is converted again,
never served.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from runtime.loading.builtin_models import BuiltinModel, builtin_model, builtin_model_names
from runtime.loading.default_model import (
    DefaultModelError,
    build_model_dir,
    ensure_builtin_model,
    ensure_default_model,
    radixserve_home,
    verify_model_dir,
)
from runtime.loading.gguf_split import split_parts

OLLAMA_PREFIX = "ollama:"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
# What a user's GGUF converts with: its own chat template, no generation defaults of ours.
# What a user's GGUF converts into; part of the cache key, so a folder an older converter wrote is
# converted again, never served (2: the quantized tensors as codes only, experts and Llama's q/k
# included; 3: the 4-bit ones read from the GGUF itself, runtime/loading/gguf_refs.py).
FORMAT = "radixserve-gguf-3"
USER_GGUF = BuiltinModel(name="", aliases=(), title="", parts=(), sha256="", install_hint="")


def resolve_model_path(model: str, gguf_file: str | None = None) -> Path:
    """The folder to load for `--model` (and `--gguf-file` for a Hugging Face repository of GGUFs)."""
    if model == "default":
        return ensure_default_model()
    builtin = builtin_model(model)
    if builtin is not None:
        return ensure_builtin_model(builtin)
    if model.startswith(OLLAMA_PREFIX):
        return gguf_model_dir(ollama_blob(model.removeprefix(OLLAMA_PREFIX)))
    path = Path(model).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        if not path.is_file():
            raise ValueError(f"model: the GGUF file {path} does not exist")
        return gguf_model_dir(path)
    if (path / "config.json").is_file():
        return path
    if path.exists():
        raise ValueError(f"model: the folder {path} has no config.json (a Hugging Face checkpoint needs one)")
    if _looks_like_hub_id(model):
        return hub_model(model, gguf_file)
    raise ValueError(
        f"model: {model!r} is not a built-in model ({', '.join(builtin_model_names())}), an `ollama:NAME[:TAG]`, "
        "a .gguf file, a folder with a config.json, or a Hugging Face id `org/repo`")


def _looks_like_hub_id(model: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", model) is not None


# -- a GGUF file, converted once ----------------------------------------------------------------------


def gguf_model_dir(path: Path) -> Path:
    """The converted folder of a GGUF file (or of a split GGUF's first part), converting it on first use."""
    path = path.resolve()
    parts = split_parts(path)
    stamp = "\0".join([FORMAT, *(f"{p}\0{p.stat().st_size}\0{p.stat().st_mtime_ns}" for p in parts)])
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    folder = radixserve_home() / "models" / "gguf" / f"{path.stem}-{key}"
    if folder.exists():
        try:
            verify_model_dir(folder)
            return folder
        except DefaultModelError as exc:  # a damaged conversion is rebuilt, never served
            print(f"radixserve: {exc}; converting again", flush=True)
    for part in parts:  # (a cached conversion was checked when it was made: same paths, sizes and times)
        _check_gguf(part)
    print(f"radixserve: first use of {path}: converting it into {folder}; this happens once", flush=True)
    # The file's quantized tensors kept as their codes only: served from them (runtime/cpu/
    # block_linear.py), never copied at several times the file's size.
    return build_model_dir(path, folder, model=USER_GGUF, full=False)


def _check_gguf(path: Path) -> None:
    """A clear error for a file that is not a GGUF before anything reads it further."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ValueError(f"model: {path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    from runtime.loading.gguf_file import GGUFFile

    try:
        GGUFFile(path)  # the header, and every tensor's data within the file
    except Exception as exc:  # a truncated or lying header
        raise ValueError(f"model: {path} is a damaged GGUF file: {exc}") from None


# -- Ollama's store -----------------------------------------------------------------------------------


def ollama_models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_blob(name: str) -> Path:
    """The GGUF blob of `NAME[:TAG]` (tag `latest` by default) in Ollama's local store."""
    base, _, tag = name.partition(":")
    if not base or "/" in tag:
        raise ValueError(f"model: {OLLAMA_PREFIX}{name} is not of the form ollama:NAME[:TAG]")
    store = ollama_models_dir()
    namespace, _, model = base.rpartition("/")
    manifest = store / "manifests" / OLLAMA_REGISTRY / (namespace or "library") / model / (tag or "latest")
    if not manifest.is_file():
        raise ValueError(f"model: Ollama's store at {store} has no {base}:{tag or 'latest'} ({manifest} is missing; "
                         f"`ollama pull {base}:{tag or 'latest'}` fetches it, or set OLLAMA_MODELS)")
    try:
        layers = json.loads(manifest.read_text())["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise ValueError(f"model: {manifest} is not an Ollama manifest with a model layer") from None
    blob = store / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise ValueError(f"model: the model layer {blob} named by {manifest} is missing")
    return blob


# -- the Hugging Face hub -----------------------------------------------------------------------------

HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def hub_model(repo: str, gguf_file: str | None) -> Path:
    """A hub repository through huggingface_hub: its cache first (only the cache when HF_HUB_OFFLINE=1)."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        if gguf_file is not None:
            return gguf_model_dir(Path(huggingface_hub.hf_hub_download(repo, gguf_file)))
        folder = Path(huggingface_hub.snapshot_download(repo, allow_patterns=HUB_FILES))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        offline = " (HF_HUB_OFFLINE is set: only the local cache is read)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ValueError(f"model: the Hugging Face repository {repo!r} could not be read{offline}: {exc}") from None
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f"; choose one of its GGUF files with --gguf-file ({', '.join(ggufs)})" if ggufs else (
            "; a repository of GGUF files needs --gguf-file NAME")
        raise ValueError(f"model: the Hugging Face repository {repo!r} has no config.json{hint}")
    return folder
