"""`--model` as users give it: a .gguf file, `ollama:NAME[:TAG]` from Ollama's store, a Hugging Face id
from the hub's cache (offline), a folder; each laid out by the test as the real tool lays it out.
A GGUF converts once and is reused; a damaged conversion is rebuilt; a bad file is a clear error."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import httpx
import pytest

from runtime import Engine
from runtime.loading import sources
from runtime.loading.sources import resolve_model_path
from tests.server.harness import server_process
from tests.tiny_gguf import write_tiny_gemma3_gguf
from tests.tiny_models import save_tiny_model

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def test_a_gguf_file_converts_once_and_serves(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "tiny-gemma3.gguf"
    write_tiny_gemma3_gguf(gguf)
    folder = resolve_model_path(str(gguf))
    assert folder.parent == home / "models" / "gguf" and (folder / "config.json").is_file()
    with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=256) as engine:
        by_path = engine.generate("the cat sat", sampling_params=GREEDY)[0].token_ids
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256) as engine:
        assert engine.generate("the cat sat", sampling_params=GREEDY)[0].token_ids == by_path

    def no_second_conversion(*args: object, **kwargs: object) -> Path:
        raise AssertionError("converted again")

    monkeypatch.setattr(sources, "build_model_dir", no_second_conversion)
    assert resolve_model_path(str(gguf)) == folder  # reused
    (folder / "model.safetensors").write_bytes(b"damaged")
    monkeypatch.undo()
    monkeypatch.setenv("RADIXSERVE_HOME", str(home))
    assert resolve_model_path(str(gguf)) == folder  # rebuilt, not served damaged
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=256) as engine:
        assert engine.generate("the cat sat", sampling_params=GREEDY)[0].token_ids == by_path


def test_bad_model_files_are_clear_errors_naming_the_path(tmp_path: Path, home: Path) -> None:
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(ValueError, match=r"weights\.gguf is not a GGUF file"):
        resolve_model_path(str(not_gguf))
    good = tmp_path / "good.gguf"
    write_tiny_gemma3_gguf(good)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated\.gguf is a damaged GGUF"):
        resolve_model_path(str(truncated))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="part 2 of a split GGUF"):
        second = tmp_path / "big-00002-of-00003.gguf"
        shutil.copy(good, second)
        resolve_model_path(str(second))
    with pytest.raises(ValueError, match="is not a built-in model"):
        resolve_model_path("no such thing at all")


def _ollama_store(root: Path, gguf: Path, name: str, tag: str) -> None:
    """Ollama's layout: a manifest per name and tag, its layers as content-addressed blobs."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    shutil.copy(gguf, root / "blobs" / f"sha256-{digest}")
    namespace, _, model = name.rpartition("/")
    manifest = root / "manifests" / "registry.ollama.ai" / (namespace or "library") / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
         "size": gguf.stat().st_size}]}))


def test_ollama_models_come_from_ollamas_own_store(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gemma3_gguf(gguf)
    store = tmp_path / "ollama"
    _ollama_store(store, gguf, "tiny", "latest")
    _ollama_store(store, gguf, "someone/tiny", "q8")
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    folder = resolve_model_path("ollama:tiny")
    assert resolve_model_path("ollama:tiny:latest") == folder
    assert (folder / "config.json").is_file()
    assert resolve_model_path("ollama:someone/tiny:q8").is_dir()
    with Engine(model="ollama:tiny", dtype="float32", kv_cache_tokens=256) as engine:
        assert len(engine.generate("the cat", sampling_params=GREEDY)[0].token_ids) == 6
    with pytest.raises(ValueError, match="ollama pull tiny:7b"):
        resolve_model_path("ollama:tiny:7b")


def _hub_cache(cache: Path, repo: str, files: Path) -> None:
    """The hub cache's layout: refs/main names a commit, snapshots/<commit>/ holds the files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    shutil.copytree(files, folder / "snapshots" / commit)


def test_a_hugging_face_id_serves_from_the_hub_cache_offline(tmp_path: Path, home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    _hub_cache(cache, "tiny-org/tiny-llama", save_tiny_model("llama", tmp_path / "llama"))
    ggufs = tmp_path / "ggufs"
    ggufs.mkdir()
    write_tiny_gemma3_gguf(ggufs / "tiny-Q8_0.gguf")
    _hub_cache(cache, "tiny-org/tiny-GGUF", ggufs)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # As a user starts it: python -m server --model org/repo (a subprocess reads the environment afresh).
    with server_process("--model", "tiny-org/tiny-llama", "--dtype", "float32", "--kv-cache-tokens", "256") as url:
        body = {"model": "tiny-org/tiny-llama", "prompt": "the cat", "max_tokens": 4, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    with server_process("--model", "tiny-org/tiny-GGUF", "--gguf-file", "tiny-Q8_0.gguf", "--dtype", "float32",
                        "--kv-cache-tokens", "256") as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "the cat", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
