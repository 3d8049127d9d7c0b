"""The fused CPU kernels (kernels/csrc/cpu_ops.cpp) against the torch ops they replace.

Each kernel is checked on its own (both dtypes, both norm forms, GQA, sliding windows, scattered
KV slots, rows that are views of a wider projection) and whole models are run with and without
them. Rows must be independent: a row computes the same bits alone as in a batch, so a request's
output never depends on who shares its step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_ops
from kernels.metadata import AttentionMetadata
from kernels.torch_attention import TorchAttentionBackend
from runtime.layers import fused
from runtime.layers.rotary import RotaryEmbedding, apply_rotary
from tests.tiny_models import save_tiny_model

OPS = cpu_ops.ops()
needs_ops = pytest.mark.skipif(OPS is None, reason="the fused CPU kernels could not be built here (no C++ compiler)")
DTYPES = [torch.float32, torch.bfloat16]


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # bf16: the kernels sum squares in another order than torch, which can move a rounding by an ulp
    tol = {"atol": 1e-5, "rtol": 1e-5} if want.dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(got, want, **tol)


def test_built_wherever_a_compiler_is() -> None:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the torch ops serve")
    assert OPS is not None
    assert cpu_ops.build_dir().is_dir()


def test_a_build_killed_midway_does_not_block_the_next(tmp_path: Path) -> None:
    """torch's build lock (`lock`), left by a process killed while building, is removed under the
    builders' own lock, which the kernel drops with its holder: the next start builds instead of
    waiting on it forever. A second builder waits for the first."""
    import multiprocessing

    def another_process_locks() -> bool:
        probe = multiprocessing.get_context("fork").Process(target=_try_lock, args=(str(tmp_path / "builder.lock"),))
        probe.start()
        probe.join(30)
        return probe.exitcode == 0

    (tmp_path / "lock").touch()
    with cpu_ops.builder_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
        assert not another_process_locks()  # held
    assert another_process_locks()  # released


def _try_lock(path: str) -> None:
    import fcntl
    import os

    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os._exit(1)
    os._exit(0)


def _torch_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scaled: bool) -> torch.Tensor:
    return fused._torch_norm(x, weight, eps, scaled)


@needs_ops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaled", [True, False])
def test_norms_match_torch(dtype: torch.dtype, scaled: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(9, 3 * 96, generator=gen).to(dtype)
    x, y = wide[:, :96], wide[:, 96:192]  # rows strided like slices of a fused projection
    weight = (1 + torch.randn(96, generator=gen)) if scaled else torch.randn(96, generator=gen).to(dtype)
    post = (1 + torch.randn(96, generator=gen)) if scaled else torch.randn(96, generator=gen).to(dtype)
    close(OPS.rms_norm(x, weight, 1e-6, scaled), _torch_norm(x, weight, 1e-6, scaled))
    total, normed = OPS.add_rms_norm(x, y, post, weight, 1e-6, scaled)
    want_total = x + _torch_norm(y, post, 1e-6, scaled)
    close(total, want_total)
    close(normed, _torch_norm(want_total, weight, 1e-6, scaled))
    total, normed = OPS.add_rms_norm(x, y, None, weight, 1e-6, scaled)  # Llama's plain residual add
    close(total, x + y)
    close(normed, _torch_norm(x + y, weight, 1e-6, scaled))


@needs_ops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("rot_share", [1.0, 0.5])
def test_qk_norm_rope_matches_torch(dtype: torch.dtype, with_norm: bool, rot_share: float) -> None:
    tokens, heads, dim = 7, 5, 32
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(tokens, (heads + 2) * dim, generator=gen).to(dtype)
    qk = qkv[:, : heads * dim].view(tokens, heads, dim)  # a view into the projection's rows
    scale = (1 + torch.randn(heads, dim, generator=gen)) if with_norm else None
    rot = int(dim * rot_share)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    cos, sin = RotaryEmbedding(inv_freq).cos_sin(torch.tensor([0, 3, 9, 100, 4095, 4096, 9000]), dtype)
    want = qk if scale is None else F.rms_norm(qk.float(), (dim,), None, 1e-6).mul_(scale).to(dtype)
    close(OPS.qk_norm_rope(qk, scale, cos, sin, 1e-6), apply_rotary(want, cos, sin))


def _decode_case(dtype: torch.dtype, heads: int, kv_heads: int, dim: int, lens: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    slots = 512
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    table = torch.zeros(len(lens) + 3, 160, dtype=torch.int64)
    order = torch.randperm(slots, generator=gen)  # scattered slots, as a long-running pool has them
    for i, n in enumerate(lens):
        table[i + 2, :n] = order[:n].roll(i)
    rows = torch.arange(2, len(lens) + 2)
    meta = AttentionMetadata.build(torch.zeros(len(lens), dtype=torch.int64), table, [n - 1 for n in lens],
                                   [1] * len(lens), rows)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, meta


@needs_ops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 1, 256), (8, 2, 16), (3, 3, 8)])
def test_decode_attention_matches_torch(dtype: torch.dtype, window: int | None, heads: int, kv_heads: int,
                                        dim: int) -> None:
    q, k_cache, v_cache, meta = _decode_case(dtype, heads, kv_heads, dim, [1, 5, 40, 150], seed=heads)
    want = TorchAttentionBackend()._decode(q, k_cache, v_cache, meta, 0.125, window)
    got = OPS.decode_attention(q, k_cache, v_cache, meta.slot_table, meta.rows, meta.seq_lens_t, window or 0, 0.125)
    close(got, want)


@needs_ops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 1, 256), (8, 2, 16)])
def test_short_extends_take_the_decode_kernel_with_the_causal_mask(dtype: torch.dtype, window: int | None,
                                                                  heads: int, kv_heads: int, dim: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose extends are short (a jump-forward draft, a short turn over a cached prefix) goes
    through the decode kernel, each new token attending to its prefix and the new tokens up to
    itself: the same as one scaled_dot_product_attention a request, and each token's row the bits
    a decode step of that token alone gives."""
    from kernels import torch_attention

    gen = torch.Generator().manual_seed(heads + dim)
    slots, prefixes, extends = 512, [2, 37, 120, 5, 60], [3, 16, 7, 1, 1]
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    table = torch.zeros(len(prefixes) + 2, 160, dtype=torch.int64)
    order = torch.randperm(slots, generator=gen)
    for i, (p, n) in enumerate(zip(prefixes, extends)):
        table[i + 1, : p + n] = order[: p + n].roll(7 * i)
    rows = torch.arange(1, len(prefixes) + 1)
    out_slots = torch.cat([table[i + 1, p : p + n] for i, (p, n) in enumerate(zip(prefixes, extends))])
    tokens = sum(extends)
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype)

    def run(short: int) -> torch.Tensor:
        monkeypatch.setattr(torch_attention, "SHORT_EXTEND", short)
        meta = AttentionMetadata.build(out_slots, table, prefixes, extends, rows)
        return TorchAttentionBackend().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.125, window)

    kernel, per_request = run(16), run(0)
    close(kernel, per_request)
    assert not torch.equal(kernel, per_request)  # the kernel's rows, not the per-request path's
    k_after, v_after = k_cache.clone(), v_cache.clone()
    k_after.index_copy_(0, out_slots, k)
    v_after.index_copy_(0, out_slots, v)
    at = 3 + 5  # the second request's sixth new token, alone as a decode step
    alone = OPS.decode_attention(q[at : at + 1], k_after, v_after, table, rows[1:2],
                                 torch.tensor([37 + 6], dtype=torch.int32), window or 0, 0.125)
    assert torch.equal(kernel[at : at + 1], alone)


@needs_ops
def test_rows_are_independent() -> None:
    """A request's numbers are the same bits alone as in a batch of others."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(37, 64, generator=gen).bfloat16(), torch.randn(37, 64, generator=gen).bfloat16()
    scale = 1 + torch.randn(64, generator=gen)
    batch = OPS.add_rms_norm(x, y, scale, scale, 1e-6, True)
    for i in (0, 17, 36):
        alone = OPS.add_rms_norm(x[i : i + 1], y[i : i + 1], scale, scale, 1e-6, True)
        assert all(torch.equal(b[i : i + 1], a) for b, a in zip(batch, alone))
    q, k_cache, v_cache, meta = _decode_case(torch.bfloat16, 4, 1, 32, [3, 90, 12], seed=4)
    together = OPS.decode_attention(q, k_cache, v_cache, meta.slot_table, meta.rows, meta.seq_lens_t, 0, 0.2)
    for i in range(3):
        alone = OPS.decode_attention(q[i : i + 1], k_cache, v_cache, meta.slot_table, meta.rows[i : i + 1],
                                     meta.seq_lens_t[i : i + 1], 0, 0.2)
        assert torch.equal(together[i : i + 1], alone)


@needs_ops
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 6, 1030])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_requests_run_of_tokens_reads_its_kv_once_and_each_token_gets_its_own_bits(
        dtype: torch.dtype, window: int | None, threads: int) -> None:
    """Adjacent rows of one request (a draft's tokens) are one unit of the kernel's work; each row
    is still the bits it gets alone: spans across the kernel's 1024-key pieces, a sliding window
    that moves a key a token, a run longer than a unit takes (20 > 16), one request alone (its run
    halved over the threads)."""
    gen = torch.Generator().manual_seed(11)
    kv_heads, heads, dim, slots = 2, 6, 32, 2600
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    table = torch.randperm(slots, generator=gen)[None].repeat(4, 1)
    table[2] = table[2].roll(100)
    # (table row, first length, tokens): lengths grow by one a token, as a draft's do
    runs = [(1, 1020, 9), (2, 3, 4), (3, 2040, 20), (2, 500, 1)]
    rows = torch.tensor([r for r, _, n in runs for _ in range(n)])
    lens = torch.tensor([first + t for _, first, n in runs for t in range(n)], dtype=torch.int32)
    q = torch.randn(len(rows), heads, dim, generator=gen).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = OPS.decode_attention(q, k_cache, v_cache, table, rows, lens, window or 0, 0.3)
        for i in range(len(rows)):
            alone = OPS.decode_attention(q[i : i + 1], k_cache, v_cache, table, rows[i : i + 1], lens[i : i + 1],
                                         window or 0, 0.3)
            assert torch.equal(together[i : i + 1], alone), i
        one_request = OPS.decode_attention(q[13:33], k_cache, v_cache, table, rows[13:33], lens[13:33], window or 0, 0.3)
        assert torch.equal(one_request, together[13:33])
    finally:
        torch.set_num_threads(before)
    want = TorchAttentionBackend()._decode(q[:9], k_cache, v_cache,
                                           AttentionMetadata.build(torch.zeros(9, dtype=torch.int64), table,
                                                                   [n - 1 for n in lens[:9].tolist()], [1] * 9,
                                                                   rows[:9]), 0.3, window)
    close(together[:9], want)


@needs_ops
def test_bad_input_is_a_clear_error() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="one weight per column"):
        OPS.rms_norm(x, torch.ones(7), 1e-6, True)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        OPS.rms_norm(x.half(), torch.ones(8).half(), 1e-6, False)
    q, k_cache, v_cache, meta = _decode_case(torch.float32, 2, 1, 8, [4], seed=5)
    with pytest.raises(RuntimeError, match="seq_lens is int32"):
        OPS.decode_attention(q, k_cache, v_cache, meta.slot_table, meta.rows, meta.seq_lens_t.long(), 0, 1.0)


@needs_ops
@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_models_match_with_and_without_the_kernels(family: str, dtype: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill and decode logits of whole models, fused kernels against the torch ops."""
    from runtime.step.forward_batch import BatchEntry, ForwardBatch
    from runtime.exec.model_runner import ModelRunner, RunnerConfig

    folder = save_tiny_model(family, tmp_path)
    ids = torch.randint(0, 200, (24,), generator=torch.Generator().manual_seed(6)).tolist()

    def logits() -> list[torch.Tensor]:
        runner = ModelRunner(RunnerConfig(folder, dtype=dtype, num_slots=128, max_requests=2, max_context=64))
        row = runner.table.alloc_row()
        runner.table.write(row, 0, torch.randperm(128, generator=torch.Generator().manual_seed(7))[:32])
        out = [runner.forward(ForwardBatch.build([BatchEntry(row, 0, ids[:16])], runner.table))]
        out += [runner.forward(ForwardBatch.build([BatchEntry(row, n, [ids[n]])], runner.table)) for n in range(16, 24)]
        return out

    fused_logits = logits()
    monkeypatch.setattr(fused, "native_ops", lambda: None)
    monkeypatch.setattr("kernels.torch_attention.cpu_ops", lambda: None)
    torch_logits = logits()
    tol = 1e-4 if dtype == "float32" else 0.15  # bf16 activations: an ulp early moves logits this much
    for got, want in zip(fused_logits, torch_logits):
        assert (got - want).abs().max() <= tol
        assert torch.equal(got.argmax(-1), want.argmax(-1))
