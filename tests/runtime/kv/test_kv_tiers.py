"""The prefix cache's host and disk tiers end to end (runtime/kv/tiers.py, radix/tiers.py).

A pool that holds one document at a time, three documents asked about in turn: with a host tier
the second round is served from demoted KV brought back; with a disk tier a restarted engine
finds the prefixes it wrote. Greedy outputs (fp32) are the same whether a prefix came from the
pool, the host tier, the disk tier, or was recomputed; a torn or corrupt file is recomputed,
never served; another dtype or another cache salt never reads what was written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_models import save_tiny_model

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiers"))


def docs(count: int = 3, length: int = 70) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 250, (length,), generator=gen).tolist() for _ in range(count)]


def small_engine(folder: Path, **kwargs: object) -> Engine:
    return Engine(model=str(folder), dtype="float32", kv_cache_tokens=96, max_running_requests=2, **kwargs)


def ask_in_turn(engine: Engine, prompts: list[list[int]], rounds: int = 2) -> list[tuple[list[int], int]]:
    out = []
    for _ in range(rounds):
        for prompt in prompts:
            (o,) = engine.generate(input_ids=[prompt], sampling_params=GREEDY)
            out.append((o.token_ids, o.cached_tokens))
    return out


def test_the_host_tier_serves_prefixes_the_pool_had_to_evict(folder: Path) -> None:
    prompts = docs()
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as big:
        want = [o.token_ids for o in big.generate(input_ids=prompts, sampling_params=GREEDY)]
    with small_engine(folder) as plain:
        without = ask_in_turn(plain, prompts)
    with small_engine(folder, kv_host_tier_tokens=1024) as tiered:
        got = ask_in_turn(tiered, prompts)
        stats = tiered.stats()
        assert_slots_balanced(tiered)
    assert [t for t, _ in got] == want * 2 and [t for t, _ in without] == want * 2
    assert all(cached == 0 for _, cached in without[3:])  # the pool alone forgot each document
    assert all(cached >= 69 for _, cached in got[3:])  # the host tier brought each one back
    assert stats["tier_promoted_host_tokens_total"] >= 3 * 69 and stats["tier_demoted_tokens_total"] > 0


def test_with_both_tiers_demoted_prefixes_are_served_from_host_memory(folder: Path, tmp_path: Path) -> None:
    prompts = docs()
    with small_engine(folder) as plain:
        want = [t for t, _ in ask_in_turn(plain, prompts, rounds=1)]
    with small_engine(folder, kv_host_tier_tokens=1024, kv_disk_dir=str(tmp_path)) as tiered:
        got = ask_in_turn(tiered, prompts)
        stats = tiered.stats()
        assert_slots_balanced(tiered)
    assert [t for t, _ in got] == want * 2 and all(cached >= 69 for _, cached in got[3:])
    assert stats["tier_promoted_host_tokens_total"] >= 3 * 69  # not read back from the files


def test_a_restarted_engine_finds_its_prefixes_on_disk(folder: Path, tmp_path: Path) -> None:
    (doc,) = docs(1)
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as first:
        (cold,) = first.generate(input_ids=[doc], sampling_params=GREEDY)
    assert cold.cached_tokens == 0 and list(tmp_path.rglob("*.kv"))
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as second:
        (warm,) = second.generate(input_ids=[doc], sampling_params=GREEDY)
        stats = second.stats()
        assert_slots_balanced(second)
    assert warm.token_ids == cold.token_ids and warm.cached_tokens == len(doc) - 1
    assert stats["tier_promoted_disk_tokens_total"] >= len(doc) - 1


def test_queued_requests_read_their_prefix_from_disk_ahead(folder: Path, tmp_path: Path) -> None:
    (doc,) = docs(1)
    prompts = [doc + [5, 6], doc + [7, 8, 9]]
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as first:
        (cold,) = first.generate(input_ids=[doc], sampling_params=GREEDY)
        want = [o.token_ids for o in first.generate(input_ids=prompts, sampling_params=GREEDY)]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=96, max_running_requests=1,
                kv_disk_dir=str(tmp_path)) as second:
        got = second.generate(input_ids=prompts, sampling_params=GREEDY)
        stats = second.stats()
        assert_slots_balanced(second)
    assert [o.token_ids for o in got] == want and got[0].cached_tokens >= len(doc) - 1
    assert stats["tier_disk_prefetched_total"] >= 1 and stats["tier_promoted_disk_tokens_total"] >= len(doc) - 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "torn"])
def test_a_damaged_file_is_recomputed_never_served(folder: Path, tmp_path: Path, damage: str) -> None:
    (doc,) = docs(1)
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as first:
        (cold,) = first.generate(input_ids=[doc], sampling_params=GREEDY)
    for path in tmp_path.rglob("*.kv"):
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[-5] ^= 0x40  # one bit of the KV payload
            path.write_bytes(bytes(data))
        elif damage == "truncate":
            path.write_bytes(bytes(data[: len(data) // 2]))
        else:  # killed mid-write: only the temporary file exists
            path.rename(path.with_suffix(".tmp"))
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as second:
        (again,) = second.generate(input_ids=[doc], sampling_params=GREEDY)
        assert_slots_balanced(second)
    assert again.token_ids == cold.token_ids and again.cached_tokens == 0 and again.error is None
    assert not list(tmp_path.rglob("*.tmp"))


def test_another_dtype_or_cache_salt_never_reads_the_files(folder: Path, tmp_path: Path) -> None:
    (doc,) = docs(1)
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as first:
        first.generate(input_ids=[doc], sampling_params=GREEDY, cache_salt="tenant-a")
    with small_engine(folder, kv_disk_dir=str(tmp_path)) as second:
        (other,) = second.generate(input_ids=[doc], sampling_params=GREEDY, cache_salt="tenant-b")
        (same,) = second.generate(input_ids=[doc], sampling_params=GREEDY, cache_salt="tenant-a")
    assert other.cached_tokens == 0 and same.cached_tokens == len(doc) - 1
    with Engine(model=str(folder), dtype="bfloat16", kv_cache_tokens=96, kv_disk_dir=str(tmp_path)) as bf16:
        (o,) = bf16.generate(input_ids=[doc], sampling_params=GREEDY, cache_salt="tenant-a")
    assert o.cached_tokens == 0
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2  # one folder per digest


def test_a_prompt_sharing_part_of_a_demoted_document_is_served_that_part(folder: Path) -> None:
    prompts = docs()
    partial = prompts[0][:40] + list(range(200, 215))  # leaves the first document after 40 tokens
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as big:
        (want,) = big.generate(input_ids=[partial], sampling_params=GREEDY)
    with small_engine(folder, kv_host_tier_tokens=1024) as tiered:
        ask_in_turn(tiered, prompts, rounds=1)  # the first document is demoted to the host tier
        promoted = tiered.stats()["tier_promoted_host_tokens_total"]
        (got,) = tiered.generate(input_ids=[partial], sampling_params=GREEDY)
        stats = tiered.stats()
        assert_slots_balanced(tiered)
    assert got.token_ids == want.token_ids and got.cached_tokens == 40
    assert stats["tier_promoted_host_tokens_total"] - promoted == 40  # only the shared part came up


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_compact_host_copies_hold_more_tokens_per_gib_and_are_served(folder: Path, dtype: str) -> None:
    prompts = docs()
    with small_engine(folder, kv_host_tier_gib=0.001) as plain:
        assert plain.kv.tiers is not None
        same_dtype = plain.kv.tiers.config.host_tokens
    with small_engine(folder, kv_host_tier_gib=0.001, kv_host_tier_dtype=dtype) as compact:
        assert compact.kv.tiers is not None
        tokens = compact.kv.tiers.config.host_tokens
        got = ask_in_turn(compact, prompts)
        assert_slots_balanced(compact)
    # llama tiny: 3 layers, 2 KV heads of 16: fp32 64 bytes a head, bf16 32, int8 16 + a 4-byte scale
    per_head = {"bfloat16": 32, "int8": 20}[dtype]
    assert same_dtype == 2**30 // 1000 // (2 * 3 * 2 * 64) and tokens == 2**30 // 1000 // (2 * 3 * 2 * per_head)
    assert tokens >= same_dtype * 64 // per_head - 1  # 2x and 3.2x the tokens in the same GiB
    assert all(cached >= 69 for _, cached in got[3:])  # served from the compact copies
    assert all(len(ids) == GREEDY["max_new_tokens"] for ids, _ in got)


def test_tier_flags_are_validated() -> None:
    from runtime import EngineArgs

    with pytest.raises(ValueError, match="kv_host_tier_dtype"):
        EngineArgs(kv_host_tier_dtype="fp8").validate()
    for bad in ({"kv_host_tier_tokens": 0}, {"kv_host_tier_gib": -1.0}, {"kv_disk_gib": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineArgs(**bad).validate()  # type: ignore[arg-type]
