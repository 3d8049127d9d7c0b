"""The host tier's copy engines (runtime/kv/tier_copy.py) and their ordering contract.

On the CPU the contract is checked with the deferred engine, whose copies run only when a step
(`before_step`) or a host reader (`HostCopy.wait`) waits for them: a promoted slot holds its KV
only once a step is about to run, a demoted slot's KV is safe to overwrite only after that, and
greedy outputs through the tiers are the same as with the synchronous engine. The CUDA engine
(pinned host copies, a copy stream, events) has `gpu` tests below, skipped without CUDA: they
have never run (no GPU was at hand when they were written).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime import Engine, EngineArgs
from runtime.kv.build import KVShape, build_kv
from runtime.kv.manager import KVManager
from runtime.kv.tier_copy import CudaCopies, DeferredCopies, SyncCopies, copy_engine
from runtime.kv.tiers import TierConfig
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.runtime.kv.test_kv_tiers import ask_in_turn, docs, small_engine
from tests.tiny_models import save_tiny_model

DOC = 8
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_kv(tiers: TierConfig, device: str = "cpu", slots: int = 16) -> KVManager:
    shape = KVShape(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device(device))
    return build_kv(shape, slots, 1, 4, 64, prefix_cache=True, tiers=tiers)


def compute(kv: KVManager, ids: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """'Run a step' for a prompt: random K/V into fresh slots, inserted into the tree."""
    slots = kv.alloc(len(ids))
    assert slots is not None
    kv.before_step()  # (as the model runner does before the step that writes them)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(2, len(ids), 2, 8, generator=gen)
    v = torch.randn(k.shape, generator=gen)
    write(kv, slots, k, v)
    assert kv.cache.insert(ids, slots) == 0
    return k, v


def write(kv: KVManager, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    device = kv.pool.k[0].device
    for layer in range(2):
        kv.pool.k[layer][slots.to(device)] = k[layer].to(device)
        kv.pool.v[layer][slots.to(device)] = v[layer].to(device)


def read(kv: KVManager, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    device = kv.pool.k[0].device
    return (torch.stack([kv.pool.k[layer][slots.to(device)] for layer in range(2)]).cpu(),
            torch.stack([kv.pool.v[layer][slots.to(device)] for layer in range(2)]).cpu())


def ids_of(doc: int) -> list[int]:
    return [100 + doc] + [500 + 8 * doc + j for j in range(DOC - 1)]


def demote_first(kv: KVManager) -> tuple[list[int], tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Docs 0 and 1 fill the 16-slot pool; then doc 0, least recently used, is demoted to the host
    tier: its download is issued and its slots are freed, with no step in between yet."""
    first = ids_of(0)
    want = compute(kv, first, 0)
    old_slots = kv.cache.match_prefix(first).indices.clone()
    compute(kv, ids_of(1), 1)
    assert kv.cache.evict(DOC) >= DOC
    assert len(kv.cache.match_prefix(first).indices) == 0 and kv.cache.lower_size() >= DOC
    return first, want, old_slots


def test_a_promoted_slot_holds_its_kv_only_once_the_step_waits() -> None:
    kv = make_kv(TierConfig(host_tokens=64, copy_engine="deferred"))
    assert isinstance(kv.tiers.copies, DeferredCopies)
    first, want, _ = demote_first(kv)
    kv.before_step()
    assert kv.cache.promote(first, None, kv.alloc) == DOC
    slots = kv.cache.match_prefix(first).indices
    assert kv.tiers.copies.pending() >= 1  # the upload is issued, not yet done
    zeros = torch.zeros(2, DOC, 2, 8)
    write(kv, slots, zeros, zeros)  # (what the slots held before: not the prefix's KV)
    assert torch.equal(read(kv, slots)[0], zeros)
    kv.before_step()  # a step is about to read them
    assert kv.tiers.copies.pending() == 0
    got = read(kv, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_demoted_slots_are_reused_only_after_their_copy_is_done() -> None:
    kv = make_kv(TierConfig(host_tokens=64, copy_engine="deferred"))
    first, want, old_slots = demote_first(kv)
    assert kv.tiers.copies.pending() >= 1  # doc 0's download has not run yet
    kv.before_step()  # the next step may write the freed slots: the download runs first
    junk = torch.full((2, DOC, 2, 8), 9.0)
    write(kv, old_slots, junk, junk)  # that step reused them
    assert kv.cache.promote(first, None, kv.alloc) == DOC
    kv.before_step()
    got = read(kv, kv.cache.match_prefix(first).indices)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_deferred_engine_shows_what_skipping_the_wait_would_do() -> None:
    """The hazard the contract prevents is real under this engine: writing freed slots before the
    step's wait loses the demoted KV (so the tests above would catch a missing wait)."""
    kv = make_kv(TierConfig(host_tokens=64, copy_engine="deferred"))
    first, want, old_slots = demote_first(kv)
    junk = torch.full((2, DOC, 2, 8), 9.0)
    write(kv, old_slots, junk, junk)  # no before_step: the pending download reads junk
    assert kv.cache.promote(first, None, kv.alloc) == DOC
    kv.before_step()
    got = read(kv, kv.cache.match_prefix(first).indices)
    assert torch.equal(got[0], junk) and not torch.equal(got[0], want[0])


def test_the_disk_writer_waits_for_a_deferred_copy(tmp_path: Path) -> None:
    tiers = TierConfig(disk_dir=tmp_path, digest="d", copy_engine="deferred")
    kv = make_kv(tiers)
    want = compute(kv, ids_of(0), 0)  # written through: the writer's copy is a pending download
    kv.tiers.flush()
    kv.tiers.close()
    again = make_kv(tiers)  # a restart reads the file back
    assert again.cache.promote(ids_of(0), None, again.alloc) == DOC
    again.before_step()
    got = read(again, again.cache.match_prefix(ids_of(0)).indices)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    again.tiers.close()


def test_greedy_outputs_are_the_same_with_deferred_copies(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    prompts = docs()
    with small_engine(folder, kv_host_tier_tokens=1024) as sync:
        want = ask_in_turn(sync, prompts)
    with small_engine(folder, kv_host_tier_tokens=1024, kv_tier_copy="deferred") as deferred:
        assert isinstance(deferred.kv.tiers.copies, DeferredCopies)
        got = ask_in_turn(deferred, prompts)
        assert deferred.stats()["tier_promoted_host_tokens_total"] >= 3 * 69
        assert_slots_balanced(deferred)
    assert got == want and all(cached >= 69 for _, cached in got[3:])


def test_the_engine_is_chosen_by_device_and_checked() -> None:
    assert type(copy_engine(torch.device("cpu"))) is SyncCopies
    assert isinstance(copy_engine(torch.device("cpu"), "deferred"), DeferredCopies)
    with pytest.raises(ValueError, match="kv_tier_copy"):
        copy_engine(torch.device("cpu"), "cuda")  # no CUDA pool
    with pytest.raises(ValueError, match="kv_tier_copy"):
        copy_engine(torch.device("cpu"), "async")
    with pytest.raises(ValueError, match="kv_tier_copy"):
        EngineArgs(model="x", kv_tier_copy="async").validate()


def test_importing_and_using_the_cpu_path_never_touches_cuda() -> None:
    code = ("import torch, runtime.kv.tier_copy as t, runtime.kv.tiers, runtime.kv.build;"
            "t.copy_engine(torch.device('cpu')); assert not torch.cuda.is_initialized(); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# -- CUDA: pinned host copies, a copy stream, events (never run: no GPU when written) -------------


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("host_dtype", ["auto", "int8"])
def test_cuda_host_copies_are_pinned_and_come_back(host_dtype: str) -> None:
    kv = make_kv(TierConfig(host_tokens=64, host_dtype=host_dtype), device="cuda")
    assert isinstance(kv.tiers.copies, CudaCopies)
    first, want, _ = demote_first(kv)
    copies = [e.host for e in kv.tiers._entries.values() if e.host is not None]
    assert copies and all(t.is_pinned() for c in copies for t in c.parts())
    kv.before_step()
    assert kv.cache.promote(first, None, kv.alloc) == DOC
    assert kv.tiers.copies.pending() >= 1
    kv.before_step()  # the forward stream waits on the upload's event
    got = read(kv, kv.cache.match_prefix(first).indices)  # read on the forward stream
    tol = 0 if host_dtype == "auto" else 0.02
    assert torch.allclose(got[0], want[0], atol=tol, rtol=0) and torch.allclose(got[1], want[1], atol=tol, rtol=0)


@pytest.mark.gpu
@CUDA
def test_cuda_copies_run_on_their_own_stream_and_the_step_waits() -> None:
    kv = make_kv(TierConfig(host_tokens=64), device="cuda")
    copies = kv.tiers.copies
    assert isinstance(copies, CudaCopies) and copies.stream != torch.cuda.current_stream()
    first, want, old_slots = demote_first(kv)
    kv.before_step()
    junk = torch.full((2, DOC, 2, 8), 9.0)
    write(kv, old_slots, junk, junk)  # a step reusing the demoted slots, after the wait
    assert kv.cache.promote(first, None, kv.alloc) == DOC
    kv.before_step()
    got = read(kv, kv.cache.match_prefix(first).indices)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@CUDA
def test_cuda_engine_greedy_outputs_are_the_same_through_the_host_tier(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    prompts = docs()
    kwargs = dict(model=str(folder), dtype="float32", kv_cache_tokens=96, max_running_requests=2, device="cuda")
    with Engine(**kwargs) as plain:
        want = ask_in_turn(plain, prompts, rounds=1)
    with Engine(**kwargs, kv_host_tier_tokens=1024, kv_disk_dir=str(tmp_path / "kv")) as tiered:
        assert isinstance(tiered.kv.tiers.copies, CudaCopies)
        got = ask_in_turn(tiered, prompts)
        assert tiered.stats()["tier_promoted_host_tokens_total"] >= 3 * 69
        assert_slots_balanced(tiered)
    assert [t for t, _ in got] == [t for t, _ in want] * 2 and all(c >= 69 for _, c in got[3:])
