"""Adapter KV is reachable by that adapter's identity (name + digest of its files) only: never by a base
request, a cache salt spelled like an adapter's name, another adapter, or new weights loaded under an
old name; the host and disk tiers and a restart keep the separation."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Engine
from runtime.kv.last_logits import prompt_key
from runtime.lora.adapter import AdapterIdentity
from runtime.lora.namespace import LoraNamespace, cache_key, from_json, key_bytes, to_json
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.runtime.lora.conftest import GREEDY, LoraSetup, lora_paths

ONE = {**GREEDY, "max_new_tokens": 4}


def _engine(s: LoraSetup, **kwargs: object) -> Engine:
    return Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024, **kwargs)


def test_namespaces_are_tagged() -> None:
    a = AdapterIdentity("a", "0" * 64)
    assert cache_key(None, None) is None and cache_key("s", None) == "s"
    assert cache_key(None, a) != "a" and cache_key("a", None) != cache_key(None, a)
    assert cache_key("s", a) != cache_key(None, a) != cache_key(None, AdapterIdentity("a", "1" * 64))
    for key in (None, "s", "", LoraNamespace(None, a), LoraNamespace("s", a)):
        assert from_json(to_json(key)) == key
    # the resend-logits key: a salt spelled like the namespace's JSON is still a salt
    spelled = to_json(LoraNamespace(None, a))
    assert key_bytes(str(spelled)) != key_bytes(LoraNamespace(None, a)) and key_bytes(None) != key_bytes("")
    assert prompt_key([1, 2], "a") != prompt_key([1, 2], LoraNamespace(None, a))
    with pytest.raises(ValueError):
        from_json({"kind": "lora", "name": 3})


def test_base_and_adapters_never_share_kv(llama_lora: LoraSetup) -> None:
    s = llama_lora
    prompt = s.prompts[0]
    with _engine(s, lora_paths=lora_paths(s, ("a", "b"))) as engine:
        first = engine.generate(input_ids=prompt, sampling_params=ONE, lora="a")[0]
        assert first.cached_tokens == 0
        again = engine.generate(input_ids=prompt, sampling_params=ONE, lora="a")[0]
        assert again.cached_tokens > 0 and again.token_ids == first.token_ids  # its own cache works
        for other in (None, "b"):  # the same prompt through the base model or another adapter: nothing cached
            out = engine.generate(input_ids=prompt, sampling_params=ONE, lora=other)[0]
            assert out.cached_tokens == 0 and out.token_ids == s.want[other][0][:4]
        # a cache salt equal to the adapter's name is a salt, not the adapter
        salted = engine.generate(input_ids=prompt, sampling_params=ONE, cache_salt="a")[0]
        assert salted.cached_tokens == 0 and salted.token_ids == s.want[None][0][:4]
        # and an adapter request with a salt is apart from the same adapter without one
        both = engine.generate(input_ids=prompt, sampling_params=ONE, lora="a", cache_salt="a")[0]
        assert both.cached_tokens == 0 and both.token_ids == first.token_ids
        assert_slots_balanced(engine)


def test_reloading_a_name_with_other_weights_never_serves_old_kv(llama_lora: LoraSetup) -> None:
    s = llama_lora
    with _engine(s, lora_paths=lora_paths(s, ("a",))) as engine:
        old = engine.generate(input_ids=s.prompts, sampling_params=GREEDY, lora="a")
        assert [o.token_ids for o in old] == s.want["a"]
        first = engine.lora.identity("a")
        engine.unload_lora_adapter("a")
        with pytest.raises(LookupError):
            engine.generate(input_ids=s.prompts[0], sampling_params=ONE, lora="a")
        new = engine.load_lora_adapter("a", str(s.adapters["b"]))  # b's weights under a's name
        assert new.name == "a" and new.digest != first.digest
        outs = engine.generate(input_ids=s.prompts, sampling_params=GREEDY, lora="a")
        assert [o.token_ids for o in outs] == s.want["b"]
        assert outs[0].cached_tokens == 0  # the old weights' KV of this very prompt is not reached
        assert_slots_balanced(engine)


def test_disk_tier_and_restart_keep_adapters_apart(llama_lora: LoraSetup, tmp_path: Path) -> None:
    s = llama_lora
    disk = str(tmp_path / "kv")
    tiers = dict(kv_disk_dir=disk, kv_host_tier_tokens=512)
    prompt = s.prompts[1]
    with _engine(s, lora_paths=lora_paths(s, ("a",)), **tiers) as engine:
        assert engine.generate(input_ids=prompt, sampling_params=ONE, lora="a")[0].cached_tokens == 0
    # a new process with the same adapter finds its KV on disk; other weights under that name do not
    with _engine(s, lora_paths=lora_paths(s, ("a",)), **tiers) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=ONE, lora="a")[0]
        assert out.cached_tokens > 0 and out.token_ids == s.want["a"][1][:4]
        base = engine.generate(input_ids=prompt, sampling_params=ONE)[0]
        assert base.cached_tokens == 0 and base.token_ids == s.want[None][1][:4]
        salted = engine.generate(input_ids=prompt, sampling_params=ONE, cache_salt="a")[0]
        assert salted.cached_tokens == 0
    with _engine(s, lora_paths=[f"a={s.adapters['b']}"], **tiers) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=ONE, lora="a")[0]
        assert out.cached_tokens == 0 and out.token_ids == s.want["b"][1][:4]
        assert_slots_balanced(engine)
