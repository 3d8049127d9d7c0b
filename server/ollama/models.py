"""What Ollama's model routes say about the one served model: its names (Ollama's clients add a
`:latest` tag), size, details, `model_info`, `capabilities` (VS Code's Ollama provider reads them to
offer tools and thinking) and the chat template."""

from __future__ import annotations

import hashlib
import json
import struct
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from server.common.errors import APIError
from server.common.state import ServerState

# The Ollama API version whose routes and fields this room speaks; clients compare it to decide
# which features (tools, thinking, structured outputs) they may use.
API_VERSION = "0.12.0"
NEVER = "2318-11-25T00:00:00Z"  # the one model stays loaded for the server's life: keep_alive is moot


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def check_model(state: ServerState, model: str | None) -> str:
    """The name to answer with; a 400 without one, a 404 (as Ollama says it) for another model."""
    if not model:
        raise APIError(400, "model is required", "model")
    names = state.model_names
    if model not in names and model.removesuffix(":latest") not in names:
        raise APIError(404, f"model '{model}' not found; this server serves '{tagged(state.served_model_name)}' "
                            "(models are chosen when the server starts: python -m server --model ...)", "model")
    return model


def capabilities(state: ServerState) -> list[str]:
    """Tools on every model (its own format, or server/pipeline/generic_tools.py); thinking where a
    reasoning parser reads it. Not "embedding", though /api/embed works: clients take a model that
    says it to be an embedding model only."""
    found = ["completion", "tools"]
    if state.reasoning_parser[0] is not None:
        found.append("thinking")
    return found


def details(state: ServerState) -> dict[str, object]:
    arch = _arch(state)
    folder = str(state.engine.model_path)
    gguf = any(f.endswith(".gguf") for f, _ in _files(folder))
    return {"parent_model": "", "format": "gguf" if gguf else "safetensors",
            "family": arch, "families": [arch], "parameter_size": _human(_parameter_count(folder)),
            "quantization_level": (state.engine.info.quantization or state.engine.info.dtype).upper()}


def entry(state: ServerState, running: bool = False) -> dict[str, object]:
    """One model as /api/tags (or, running, /api/ps) lists it."""
    name = tagged(state.served_model_name)
    size = sum(s for _, s in _files(str(state.engine.model_path)))
    shaped: dict[str, object] = {"name": name, "model": name, "size": size, "digest": _digest(state),
                                 "details": details(state)}
    if running:
        on_gpu = state.engine.info.device.startswith("cuda")
        shaped.update(expires_at=NEVER, size_vram=size if on_gpu else 0, context_length=state.engine.context_len)
    else:
        shaped["modified_at"] = datetime.fromtimestamp(state.started, UTC).isoformat().replace("+00:00", "Z")
    return shaped


def show(state: ServerState) -> dict[str, object]:
    arch = _arch(state)
    config = state.engine.model_config
    info: dict[str, object] = {"general.architecture": arch,
                               "general.parameter_count": _parameter_count(str(state.engine.model_path)),
                               f"{arch}.context_length": state.engine.context_len}
    hidden = getattr(config, "hidden_size", None)
    if hidden is not None:
        info[f"{arch}.embedding_length"] = hidden
    return {"modelfile": f"# served by radixserve\nFROM {state.engine.model_path}\n", "parameters": "",
            "template": state.engine.tokenizer.chat_template or "", "details": details(state), "model_info": info,
            "capabilities": capabilities(state),
            "modified_at": datetime.fromtimestamp(state.started, UTC).isoformat().replace("+00:00", "Z")}


def _arch(state: ServerState) -> str:
    return str(getattr(state.engine.model_config, "model_type", "") or "unknown")


def _digest(state: ServerState) -> str:
    """A stable name for this checkpoint (its path and files), not a hash of its bytes."""
    files = _files(str(state.engine.model_path))
    return hashlib.sha256(json.dumps([str(state.engine.model_path), files]).encode()).hexdigest()


@lru_cache(maxsize=4)
def _files(folder: str) -> list[tuple[str, int]]:
    path = Path(folder)
    found = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.suffix in (".safetensors", ".gguf"))
    return [(p.name, p.stat().st_size) for p in found]


@lru_cache(maxsize=4)
def _parameter_count(folder: str) -> int:
    """Parameters, from the safetensors headers (shapes only; no tensor is read)."""
    total = 0
    for name, _ in _files(folder):
        if not name.endswith(".safetensors"):
            continue
        with open(Path(folder) / name, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, tensor in header.items():
            if key != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= dim
                total += count
    return total


def _human(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}".replace(".0", "")
    return str(count)
