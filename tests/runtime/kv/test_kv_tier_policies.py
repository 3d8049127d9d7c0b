"""The host and disk tiers' policies on a real KV state without a model (runtime/kv/build.py):
retention on every tier (runtime/kv/tier_retention.py), splitting a demoted copy, and compact
host copies (runtime/kv/host_codec.py).

Each prefix is "computed" by writing random K/V into its slots, so a promotion can be checked
value for value against what was written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from runtime.kv.build import KVShape, build_kv
from runtime.kv.host_codec import HostCodec
from runtime.kv.manager import KVManager
from runtime.kv.tiers import TierConfig

SHAPE = KVShape(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device("cpu"))
DOC = 8  # tokens per document


def make_kv(tiers: TierConfig, slots: int = 32) -> KVManager:
    return build_kv(SHAPE, slots, 1, 4, 64, prefix_cache=True, tiers=tiers)


class Docs:
    """Documents of DOC tokens (no shared prefixes) and the K/V each token was given."""

    def __init__(self) -> None:
        self.kv: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.gen = torch.Generator().manual_seed(0)

    def ids(self, i: int) -> list[int]:
        return [100 + i] + [500 + 8 * i + j for j in range(DOC - 1)]  # three digits: equal-sized files

    def compute(self, kv: KVManager, i: int) -> list[int]:
        ids = self.ids(i)
        slots = kv.alloc(DOC)
        assert slots is not None
        k = torch.randn(SHAPE.num_layers, DOC, SHAPE.num_kv_heads, SHAPE.head_dim, generator=self.gen)
        v = torch.randn(k.shape, generator=self.gen)
        for layer in range(SHAPE.num_layers):
            kv.pool.k[layer][slots] = k[layer]
            kv.pool.v[layer][slots] = v[layer]
        self.kv[tuple(ids)] = (k, v)
        assert kv.cache.insert(ids, slots) == 0
        return ids

    def served(self, kv: KVManager, ids: list[int], tol: float = 0.0) -> bool:
        """Whether the whole prefix comes back (from the pool or a tier) holding its own K/V."""
        kv.cache.promote(ids, None, kv.alloc)
        slots = kv.cache.match_prefix(ids).indices
        if len(slots) < len(ids):
            return False
        k, v = self.kv[tuple(ids)]
        for layer in range(SHAPE.num_layers):
            assert torch.allclose(kv.pool.k[layer][slots], k[layer], atol=tol, rtol=0)
            assert torch.allclose(kv.pool.v[layer][slots], v[layer], atol=tol, rtol=0)
        return True


def fill_host(kv: KVManager, docs: Docs, first: int, count: int) -> None:
    """Compute `count` more documents: the pool (32 slots) demotes, the host tier (40) overflows."""
    for i in range(first, first + count):
        docs.compute(kv, i)


@pytest.mark.parametrize("retained", [False, True])
def test_a_retained_prefix_is_evicted_last_from_the_host_tier(retained: bool) -> None:
    kv, docs = make_kv(TierConfig(host_tokens=40)), Docs()
    first = docs.compute(kv, 0)
    if retained:
        assert kv.pins.pin("keep", first, ttl_s=60) == DOC
        assert kv.pins.release_oldest()  # the pool needed the room: unlocked, still retained below
    fill_host(kv, docs, 1, 12)  # 104 tokens through a 32-slot pool and a 40-token host tier
    assert docs.served(kv, first) is retained
    assert not docs.served(kv, docs.ids(1))  # an unretained one of the same age is gone either way


def test_retention_on_a_tier_is_bounded_by_priority_and_expires() -> None:
    kv, docs = make_kv(TierConfig(host_tokens=40)), Docs()
    low, high, brief = (docs.compute(kv, i) for i in range(3))
    assert kv.tiers is not None
    kv.tiers.retain("low", None, low, time.monotonic() + 60, priority=0)
    kv.tiers.retain("high", None, high, time.monotonic() + 60, priority=1)
    kv.tiers.retain("brief", None, brief, time.monotonic() + 0.05, priority=2)
    time.sleep(0.1)  # "brief" has expired
    fill_host(kv, docs, 3, 12)
    # The share is a quarter of 40 tokens: one 8-token document; the higher priority keeps it.
    assert docs.served(kv, high)
    assert not docs.served(kv, low) and not docs.served(kv, brief)


def test_unpin_ends_the_retention_on_the_tiers_too() -> None:
    kv, docs = make_kv(TierConfig(host_tokens=40)), Docs()
    first = docs.compute(kv, 0)
    assert kv.pins.pin("keep", first, ttl_s=60) == DOC
    kv.pins.unpin("keep")
    fill_host(kv, docs, 1, 12)
    assert not docs.served(kv, first)


def test_a_retained_prefix_is_evicted_last_from_the_disk_tier(tmp_path: Path) -> None:
    probe, docs = make_kv(TierConfig(disk_dir=tmp_path / "probe", digest="d")), Docs()
    docs.compute(probe, 0)
    assert probe.tiers is not None
    probe.tiers.flush()
    size = probe.tiers.disk_bytes()  # one document's file
    probe.close()
    config = TierConfig(disk_dir=tmp_path / "run", digest="d", disk_bytes=int(4.5 * size))
    kv, docs = make_kv(config), Docs()
    first, second = docs.compute(kv, 0), docs.compute(kv, 1)
    assert kv.tiers is not None
    kv.tiers.retain("keep", None, first, time.monotonic() + 60)
    for i in range(2, 10):
        docs.compute(kv, i)
        kv.tiers.flush()  # (one write at a time: the order the tier sees them is the order made)
    assert kv.tiers.disk_bytes() <= config.disk_bytes
    kv.close()
    restarted = make_kv(config)  # what survived on disk, found by a new process
    assert docs.served(restarted, first)
    assert not docs.served(restarted, second)
    restarted.close()


def one_file_bytes(tmp_path: Path) -> int:
    probe, docs = make_kv(TierConfig(disk_dir=tmp_path / "probe", digest="d")), Docs()
    docs.compute(probe, 0)
    assert probe.tiers is not None
    probe.tiers.flush()
    size = probe.tiers.disk_bytes()
    probe.close()
    return size


def wall_deadline(kv: KVManager, ids: list[int]) -> float | None:
    """The wall-clock end of the retention on the (one) lower-tier copy of `ids`."""
    assert kv.tiers is not None
    (handle,) = kv.cache.demoted_on_path(ids)
    until = kv.tiers.retained_until(handle)
    return None if until is None else time.time() + (until - time.monotonic())


def test_a_tier_retention_keeps_its_deadline_across_a_restart(tmp_path: Path) -> None:
    config = TierConfig(disk_dir=tmp_path / "run", digest="d", disk_bytes=int(4.5 * one_file_bytes(tmp_path)))
    kv, docs = make_kv(config), Docs()
    first, second = docs.compute(kv, 0), docs.compute(kv, 1)
    assert kv.tiers is not None
    deadline = time.time() + 60
    kv.tiers.retain("keep", None, first, time.monotonic() + 60)
    kv.tiers.retain("brief", None, second, time.monotonic() + 0.05)
    kv.close()
    time.sleep(0.1)  # "brief" is over before the restart
    restarted = make_kv(config)
    kept = wall_deadline(restarted, first)
    assert kept is not None and abs(kept - deadline) < 5  # the same deadline, not a fresh one
    assert wall_deadline(restarted, second) is None
    for i in range(2, 10):  # the restarted disk tier overflows: the retained prefix is kept
        docs.compute(restarted, i)
        assert restarted.tiers is not None
        restarted.tiers.flush()
    assert docs.served(restarted, first)
    assert not docs.served(restarted, second)
    restarted.close()


@pytest.mark.parametrize("record", ["absent", "damaged"])
def test_files_without_a_retention_record_still_load(tmp_path: Path, record: str) -> None:
    config = TierConfig(disk_dir=tmp_path, digest="d")
    kv, docs = make_kv(config), Docs()
    first = docs.compute(kv, 0)
    assert kv.tiers is not None and kv.tiers.folder is not None
    kv.tiers.retain("keep", None, first, time.monotonic() + 60)
    kv.close()
    saved = kv.tiers.folder / "retained.json"
    assert "expires_at" in saved.read_text()
    if record == "absent":
        saved.unlink()  # a folder written before retention was recorded
    else:
        saved.write_text('{"retained": [{"name": "keep", "path": "x"}]')
    restarted = make_kv(config)
    assert wall_deadline(restarted, first) is None
    assert docs.served(restarted, first)
    restarted.close()


@pytest.mark.parametrize("disk", [False, True])
def test_a_split_copy_promotes_the_shared_part_and_keeps_the_rest(tmp_path: Path, disk: bool) -> None:
    config = TierConfig(host_tokens=0 if disk else 64, disk_dir=tmp_path if disk else None, digest="d")
    kv, docs = make_kv(config, slots=16), Docs()
    ids = docs.compute(kv, 0)
    if disk:
        assert kv.tiers is not None
        kv.tiers.flush()
        written = sorted(tmp_path.rglob("*.kv"))
    kv.cache.evict(16)
    assert kv.cache.lower_size() == DOC and kv.allocator.available() == 16
    prompt = ids[:5] + [7, 7]
    assert kv.cache.promote(prompt, None, kv.alloc) == 5  # the shared part only
    assert kv.allocator.available() == 11 and kv.cache.lower_size() == DOC - 5
    slots = kv.cache.match_prefix(prompt).indices
    k, _ = docs.kv[tuple(ids)]
    assert torch.equal(kv.pool.k[1][slots], k[1, :5])
    if disk:
        assert kv.tiers is not None
        kv.tiers.flush()
        assert sorted(tmp_path.rglob("*.kv")) == written  # both parts are runs of the same file
        assert kv.tiers.stats.writes == 1 and kv.tiers.stats.reads == 1  # the part promoted: one read
    assert docs.served(kv, ids)  # the rest comes up when a prompt walks on
    kv.close()


@pytest.mark.parametrize("name", ["bfloat16", "int8"])
def test_compact_host_copies_round_trip_within_their_bound(name: str) -> None:
    codec = HostCodec(name, torch.float32)
    k = torch.randn(3, 50, 2, 64) * torch.logspace(-2, 2, 50).view(1, 50, 1, 1)  # scales differ per token
    v = torch.randn(3, 50, 2, 64)
    copy = codec.encode(k, v)
    back_k, back_v = codec.decode(copy)
    assert back_k.dtype == torch.float32 and back_k.shape == k.shape
    for x, y in ((k, back_k), (v, back_v)):
        absmax = x.abs().amax(dim=-1, keepdim=True)
        bound = absmax / 254 * 1.0001 if name == "int8" else x.abs() * 2.0**-8
        assert ((x - y).abs() <= bound).all()
    assert copy.nbytes() < (k.numel() + v.numel()) * 4 / (1.9 if name == "bfloat16" else 3.5)


def test_auto_keeps_the_pools_dtype_bit_for_bit() -> None:
    codec = HostCodec("auto", torch.bfloat16)
    k = torch.randn(2, 5, 1, 16).to(torch.bfloat16)
    assert codec.lossless and codec.name == "bfloat16" and torch.equal(codec.decode(codec.encode(k, k))[0], k)
    assert HostCodec("int8", torch.float32).bytes_per_token(18, 1, 256) == 2 * 18 * (256 + 4)
    with pytest.raises(ValueError, match="kv_host_tier_dtype"):
        HostCodec("fp8", torch.float32)


def test_int8_files_are_read_back_and_another_encoding_refuses_them(tmp_path: Path) -> None:
    int8 = TierConfig(host_tokens=64, disk_dir=tmp_path, digest="d", host_dtype="int8")
    kv, docs = make_kv(int8), Docs()
    ids = docs.compute(kv, 0)
    assert kv.tiers is not None
    kv.tiers.flush()
    kv.close()
    (path,) = tmp_path.rglob("*.kv")
    assert b'"dtype": "int8"' in path.read_bytes()[:4096]
    again = make_kv(int8)
    k, v = docs.kv[tuple(ids)]
    assert docs.served(again, ids, tol=float(max(k.abs().max(), v.abs().max())) / 127)  # within the int8 step
    again.close()
    other = make_kv(TierConfig(disk_dir=tmp_path, digest="d"))  # same folder, float32 files expected
    assert other.cache.lower_size() == 0 and not docs.served(other, ids)
    assert other.tiers is not None and other.tiers.stats.corrupt == 1
    other.close()


def test_a_queued_prefix_on_disk_is_read_ahead_and_promoted_from_memory(tmp_path: Path) -> None:
    config = TierConfig(disk_dir=tmp_path, digest="d")
    kv, docs = make_kv(config), Docs()
    ids = docs.compute(kv, 0)
    kv.close()  # (the writes finish first)
    again = make_kv(config)
    assert again.tiers is not None
    handles = again.cache.demoted_on_path(ids + [1, 2])
    assert len(handles) == 1 and again.cache.demoted_on_path([1, 2]) == []
    assert again.tiers.prefetch(handles) == 1
    assert again.tiers.prefetch(handles) == 0  # under way or done: not queued twice
    assert docs.served(again, ids)  # the load waits for the read under way rather than reading again
    assert again.tiers.stats.prefetched == 1 and again.tiers.stats.reads == 0
    assert again.cache.stats.promoted_tokens == {"disk": DOC}
    again.close()
