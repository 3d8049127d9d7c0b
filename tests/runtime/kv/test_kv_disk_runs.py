"""The disk tier's files read in part (runtime/kv/kv_files.py): blocks each with its checksum, runs
of a file's tokens, and a split disk copy that stays in its file (runtime/kv/tiers.py).

A demoted prefix split on the disk tier (a prompt shares only its first part) keeps both parts as
runs of the one file already written: nothing is rewritten, the shared part is promoted holding
its own KV, the whole comes back after a restart, and a damaged block is still detected by
whichever run reads it (and never served)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from radix.tiers import StoredKey
from runtime.kv.build import KVShape, build_kv
from runtime.kv.host_codec import HostCodec
from runtime.kv.kv_files import MAGIC, MAGIC_V1, read_kv_file, read_kv_key, write_kv_file
from runtime.kv.manager import KVManager
from runtime.kv.tiers import TierConfig

SHAPE = KVShape(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device("cpu"))
LONG = 40  # tokens: three 16-token blocks (the last one short)
IDS = [100] + list(range(200, 200 + LONG - 1))


def header_end(path: Path) -> int:
    data = path.read_bytes()
    return len(MAGIC) + 8 + int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def copy_of(codec: HostCodec, tokens: int) -> tuple[torch.Tensor, torch.Tensor, object]:
    gen = torch.Generator().manual_seed(tokens)
    k = torch.randn(2, tokens, 2, 8, generator=gen)
    v = torch.randn(k.shape, generator=gen)
    return k, v, codec.encode(k, v)


@pytest.mark.parametrize("name", ["auto", "int8"])
def test_any_run_of_a_file_reads_back_by_its_blocks(tmp_path: Path, name: str) -> None:
    codec = HostCodec(name, torch.float32)
    _, _, whole = copy_of(codec, 10)
    key = StoredKey("salt", np.arange(12, dtype=np.int64), 2)
    run = write_kv_file(tmp_path, "d", key, codec.name, whole, block_tokens=4)  # blocks of 4, 4 and 2 tokens
    assert (run.first, run.count, run.file_tokens, run.file_bytes) == (0, 10, 10, run.path.stat().st_size)
    stored = read_kv_key(run.path, "d", codec.name)
    assert stored is not None and stored.extra_key == "salt" and stored.start == 2
    for first, count in [(0, 10), (3, 5), (8, 2), (4, 4), (0, 1)]:
        part = read_kv_file(run.path, codec, first, count)
        assert part is not None
        for got, want in zip(part.parts(), whole.parts()):
            assert torch.equal(got, want[:, first : first + count])
    assert run.part(3, 10).share + run.part(0, 3).share <= run.file_bytes


def test_a_damaged_block_fails_every_run_that_reads_it(tmp_path: Path) -> None:
    codec = HostCodec("auto", torch.float32)
    _, _, whole = copy_of(codec, 10)
    run = write_kv_file(tmp_path, "d", StoredKey(None, np.arange(10, dtype=np.int64), 0), codec.name, whole,
                        block_tokens=4)
    per_token = 2 * 2 * 2 * 8 * 4  # K and V of 2 layers x 2 heads x 8 dims, float32
    flip(run.path, header_end(run.path) + 9 * per_token + 3)  # a byte of token 9: the last block
    assert read_kv_file(run.path, codec, 0, 8) is not None  # blocks 0 and 1 are whole: served
    assert read_kv_file(run.path, codec, 6, 4) is None  # reads the damaged block: refused
    assert not run.path.exists()  # and the file goes


def test_files_of_the_first_format_still_read(tmp_path: Path) -> None:
    codec = HostCodec("auto", torch.float32)
    _, _, whole = copy_of(codec, 6)
    payload = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in whole.parts())
    header = json.dumps({"digest": "d", "extra_key": None, "path": list(range(6)), "start": 0, "dtype": "float32",
                         "shape": list(whole.k.shape), "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    path = tmp_path / "old.kv"
    path.write_bytes(MAGIC_V1 + len(header).to_bytes(8, "little") + header + payload)
    assert read_kv_key(path, "d", "float32") is not None
    part = read_kv_file(path, codec, 2, 3)
    assert part is not None and torch.equal(part.k, whole.k[:, 2:5])
    assert torch.equal(read_kv_file(path, codec).v, whole.v)  # type: ignore[union-attr]


def make_kv(folder: Path) -> KVManager:
    return build_kv(SHAPE, 64, 1, 4, 128, prefix_cache=True, tiers=TierConfig(disk_dir=folder, digest="d"))


def compute_long(kv: KVManager) -> tuple[torch.Tensor, torch.Tensor]:
    """The 40-token prompt 'computed', written to disk and demoted out of the pool."""
    slots = kv.alloc(LONG)
    assert slots is not None
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(2, LONG, 2, 8, generator=gen), torch.randn(2, LONG, 2, 8, generator=gen)
    for layer in range(2):
        kv.pool.k[layer][slots], kv.pool.v[layer][slots] = k[layer], v[layer]
    assert kv.cache.insert(IDS, slots) == 0
    assert kv.tiers is not None
    kv.tiers.flush()
    kv.cache.evict(64)
    assert kv.cache.lower_size() == LONG
    return k, v


def holds(kv: KVManager, ids: list[int], k: torch.Tensor, v: torch.Tensor) -> bool:
    slots = kv.cache.match_prefix(ids).indices
    n = len(slots)
    return all(torch.equal(kv.pool.k[layer][slots], k[layer, :n]) and torch.equal(kv.pool.v[layer][slots], v[layer, :n])
               for layer in range(2))


def split_and_promote_head(kv: KVManager, head: int = 20) -> None:
    prompt = IDS[:head] + [7, 7]
    assert kv.cache.promote(prompt, None, kv.alloc) == head  # the node is split on the disk tier
    assert kv.cache.lower_size() == LONG - head


def test_a_split_disk_copy_stays_in_its_file_and_promotes(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    k, v = compute_long(kv)
    (written,) = tmp_path.rglob("*.kv")
    split_and_promote_head(kv)
    assert holds(kv, IDS[:20], k, v)
    assert kv.tiers is not None and kv.tiers.stats.writes == 1  # nothing rewritten
    assert list(tmp_path.rglob("*.kv")) == [written]
    assert kv.tiers.disk_bytes() == written.stat().st_size  # the parts' shares add up to the file
    assert kv.cache.promote(IDS, None, kv.alloc) == LONG - 20  # the rest, from the same file
    assert holds(kv, IDS, k, v) and len(kv.cache.match_prefix(IDS).indices) == LONG
    kv.close()


def test_a_split_disk_copy_survives_a_restart(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    k, v = compute_long(kv)
    split_and_promote_head(kv)
    kv.cache.evict(64)  # the head leaves the pool again: its run of the file is all that is left of it
    assert kv.cache.lower_size() == LONG
    kv.close()
    again = make_kv(tmp_path)  # the file comes back whole
    assert again.cache.lower_size() == LONG
    assert again.cache.promote(IDS, None, again.alloc) == LONG
    assert holds(again, IDS, k, v)
    again.close()


@pytest.mark.parametrize("damaged", ["head", "tail"])
def test_a_corrupt_block_under_a_split_copy_is_detected(tmp_path: Path, damaged: str) -> None:
    kv = make_kv(tmp_path)
    compute_long(kv)
    (path,) = tmp_path.rglob("*.kv")
    per_token = 2 * 2 * 2 * 8 * 4
    token = 3 if damaged == "head" else 35  # a byte in block 0 (the head's run) or block 2 (the tail's)
    flip(path, header_end(path) + token * per_token + 5)
    prompt = IDS[:20] + [7, 7]
    head = kv.cache.promote(prompt, None, kv.alloc)
    assert kv.tiers is not None
    if damaged == "head":
        assert head == 0 and kv.tiers.stats.corrupt == 1 and not path.exists()
        assert kv.cache.promote(IDS, None, kv.alloc) == 0  # the tail's run went with the file
    else:
        assert head == 20 and kv.tiers.stats.corrupt == 0  # blocks 0 and 1 are whole
        assert kv.cache.promote(IDS, None, kv.alloc) == 0 and kv.tiers.stats.corrupt == 1
        assert len(kv.cache.match_prefix(IDS).indices) == 20  # the tail is recomputed, never served
    assert kv.cache.lower_size() == 0
    assert kv.allocator.available() + kv.cache.evictable_size() == 64  # every slot back
    kv.close()


def test_a_node_split_on_the_device_keeps_its_disk_copy_in_one_file(tmp_path: Path) -> None:
    kv = make_kv(tmp_path)
    slots = kv.alloc(LONG)
    assert slots is not None and kv.tiers is not None
    k = torch.randn(2, LONG, 2, 8, generator=torch.Generator().manual_seed(5))
    for layer in range(2):
        kv.pool.k[layer][slots], kv.pool.v[layer][slots] = k[layer], -k[layer]
    kv.cache.insert(IDS, slots)
    kv.tiers.flush()
    (written,) = tmp_path.rglob("*.kv")
    assert len(kv.cache.match_prefix(IDS[:20] + [7, 7]).indices) == 20  # splits the node on the device
    kv.tiers.flush()
    assert list(tmp_path.rglob("*.kv")) == [written] and kv.tiers.stats.writes == 1  # no rewrite
    kv.cache.evict(64)  # both parts leave the pool: their runs of the file hold them
    assert kv.cache.promote(IDS, None, kv.alloc) == LONG and holds(kv, IDS, k, -k)
    kv.close()
