"""The CPU thread count (runtime/cpu/thread_budget.py): chosen from the cores the process may use and
lowered while other processes hold some. No speed is asserted: the policy is checked on given
readings, the readings on real /proc files and a real busy neighbour, and the engine under a
one-core affinity mask by what it reports and that it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runtime import Engine
from runtime.cpu.thread_budget import (
    ThreadGovernor,
    allowed_cpus,
    busy_seconds,
    cgroup_quota,
    thread_ceiling,
    threads_for,
)
from tests.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[3]


def test_ceiling_follows_the_cores_the_quota_and_the_user():
    assert thread_ceiling(cpus=1, torch_default=8) == 1  # an affinity mask of one core
    assert thread_ceiling(cpus=8, quota=1.5, torch_default=8) == 1  # docker --cpus=1.5
    assert thread_ceiling(cpus=8, quota=0.5, torch_default=8) == 1  # never none
    assert thread_ceiling(cpus=8, quota=3.0, torch_default=8) == 3
    assert thread_ceiling(cpus=8, torch_default=4) == 4  # torch's own default when nothing is asked
    assert thread_ceiling(requested=6, cpus=8, torch_default=4) == 6  # --cpu-threads
    assert thread_ceiling(requested=16, cpus=8, torch_default=4) == 8  # never more than the cores
    assert thread_ceiling(cpus=8, omp_env="3", torch_default=4) == 3  # OMP_NUM_THREADS
    assert thread_ceiling(requested=2, cpus=8, omp_env="3", torch_default=4) == 2  # the flag wins


def test_threads_are_the_cores_other_processes_leave():
    assert threads_for(ceiling=2, cpus=2, others=0.0) == 2
    assert threads_for(ceiling=2, cpus=2, others=0.3) == 2  # a light client does not cost a thread
    assert threads_for(ceiling=2, cpus=2, others=1.0) == 1  # a busy neighbour on one of two cores
    assert threads_for(ceiling=2, cpus=2, others=2.0) == 1  # never none
    assert threads_for(ceiling=8, cpus=16, others=6.0) == 8
    assert threads_for(ceiling=16, cpus=16, others=6.0) == 10


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path: Path):
    (tmp_path / "proc").write_text("0::/system.slice/radix.service\n")
    service = tmp_path / "fs" / "system.slice" / "radix.service"
    service.mkdir(parents=True)
    (service / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path / "fs", tmp_path / "proc") is None
    (service / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path / "fs", tmp_path / "proc") == 1.5
    (tmp_path / "fs" / "system.slice" / "cpu.max").write_text("100000 100000\n")  # the parent's is tighter
    assert cgroup_quota(tmp_path / "fs", tmp_path / "proc") == 1.0


def test_cgroup_v1_quota(tmp_path: Path):
    (tmp_path / "proc").write_text("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    folder = tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path / "fs", tmp_path / "proc") is None
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    assert cgroup_quota(tmp_path / "fs", tmp_path / "proc") == 2.0


class Readings:
    """A machine of two cores whose busy time the test writes: (others' share, ours) per reading."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_total = 0.0
        self.ours_total = 0.0
        self.applied: list[int] = []

    def advance(self, seconds: float, others: float, ours: float) -> None:
        self.now += seconds
        self.busy_total += seconds * (others + ours)
        self.ours_total += seconds * ours

    def governor(self) -> ThreadGovernor:
        return ThreadGovernor(2, (0, 1), interval=0.5, busy=lambda: self.busy_total, ours=lambda: self.ours_total,
                              clock=lambda: self.now, apply=self.applied.append)


def test_governor_goes_down_at_once_and_up_after_two_readings():
    r = Readings()
    gov = r.governor()
    assert gov.before_step() == 2 and r.applied == [2]
    r.advance(0.6, others=0.0, ours=2.0)
    assert gov.before_step() == 2  # idle machine: all the cores
    r.advance(0.1, others=1.0, ours=1.0)
    assert gov.before_step() == 2  # not yet time to read
    r.advance(0.5, others=1.0, ours=1.0)
    assert gov.before_step() == 1 and r.applied == [2, 1]  # a neighbour took a core: down at once
    assert gov.others == pytest.approx(1.0, abs=0.05)
    r.advance(0.6, others=1.0, ours=1.0)
    assert gov.before_step() == 1
    r.advance(0.6, others=0.0, ours=1.0)
    assert gov.before_step() == 1  # the neighbour paused: one reading is not enough
    r.advance(0.6, others=0.0, ours=1.0)
    assert gov.before_step() == 2 and r.applied == [2, 1, 2]
    assert gov.changes == 2


def test_proc_stat_busy_time_reads_and_grows():
    cpus = allowed_cpus()
    assert cpus
    first = busy_seconds(cpus)
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # keep one core busy for a moment
        pass
    assert busy_seconds(cpus) > first


def test_a_niced_neighbour_is_not_contention_unless_we_are_niced_too(tmp_path):
    """/proc/stat's nice ticks are a niced process's: it yields its core to us at once, so they are
    not another process's load; where we run niced ourselves, our own time is there and counts."""
    import os

    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    #                 user nice system idle iowait irq softirq steal
    stat.write_text(f"cpu  0 0 0 0 0 0 0 0\ncpu0 {hz} {5 * hz} 0 100 0 0 0 0\ncpu1 {hz} 0 {hz} 100 0 0 0 0\n")
    assert busy_seconds((0, 1), stat, niced=False) == 3.0
    assert busy_seconds((0, 1), stat, niced=True) == 8.0
    assert busy_seconds((1,), stat, niced=True) == 2.0


def test_governor_sees_a_real_busy_neighbour():
    cpus = allowed_cpus()
    if len(cpus) < 2:
        pytest.skip("one core: there is nothing to give up")
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        applied: list[int] = []
        gov = ThreadGovernor(len(cpus), cpus, interval=0.3, apply=applied.append)
        gov.before_step()
        for _ in range(3):
            time.sleep(0.35)
            gov.before_step()
        # the neighbour's core is counted as taken (others may hold more on a shared machine)
        assert gov.others >= 0.7
        assert gov.threads < len(cpus) and applied[-1] == gov.threads
    finally:
        neighbour.kill()
        neighbour.wait()


def test_engine_under_a_one_core_mask_uses_one_thread_and_serves(tmp_path: Path):
    """`taskset -c 0` as a user would: the engine reports one thread, keeps no governor, and serves."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity masks here")
    script = textwrap.dedent(f"""
        import os, sys
        os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
        sys.path.insert(0, {str(ROOT)!r})
        from runtime import Engine
        with Engine(model=sys.argv[1], device="cpu", dtype="float32", kv_cache_tokens=256) as engine:
            out = engine.generate(input_ids=[[5, 6, 7]],
                                  sampling_params={{"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
            print(engine.info.cpu_threads, engine.info.adapt_cpu_threads, len(out[0].token_ids))
    """)
    folder = save_tiny_model("llama", tmp_path)
    result = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, timeout=300, check=False,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1", "False", "4"]


def test_engine_reports_its_threads_and_governs_them(tmp_path: Path):
    folder = save_tiny_model("llama", tmp_path)
    with Engine(model=str(folder), device="cpu", dtype="float32", kv_cache_tokens=256) as engine:
        engine.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 2, "temperature": 0})
        ceiling = thread_ceiling(cpus=len(allowed_cpus()), quota=cgroup_quota(),
                                 omp_env=os.environ.get("OMP_NUM_THREADS"), torch_default=engine.info.cpu_threads)
        assert engine.info.cpu_threads == ceiling
        assert engine.info.adapt_cpu_threads == (ceiling > 1)
        if engine.info.adapt_cpu_threads:
            assert 1 <= engine.stats()["cpu_threads"] <= ceiling
    with Engine(model=str(folder), device="cpu", dtype="float32", kv_cache_tokens=256, num_threads=1) as engine:
        assert engine.info.cpu_threads == 1 and not engine.info.adapt_cpu_threads  # --cpu-threads 1
        assert "cpu_threads" not in engine.stats()
