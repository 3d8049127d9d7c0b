"""How many threads the CPU path computes with, and how that number follows the cores it really gets.

torch's intra-op threads, our fused kernels (at::parallel_for) and oneDNN all run on one OpenMP pool,
the engine thread's (host_threads.py), so one count governs them all. Its ceiling comes from the
cores this process may use: the affinity mask (`taskset`, a cpuset), a cgroup CPU quota rounded down
(`docker --cpus=1.5`: one thread), or the user's own `--cpu-threads` / `OMP_NUM_THREADS`.

Then, between steps, `ThreadGovernor` watches what other processes take of those cores. OpenMP
threads wait for each other at the end of every parallel region, spinning; when another process
holds one of our cores, the thread that was placed there waits for a timeslice and every region
of the step waits with it. Measured on a 2-core Xeon (docs/benchmarks.md, "Sharing the machine"):
one stream fell from 30.6 to 1.8 tok/s with a busy neighbour on one core. Passive waits
(`OMP_WAIT_POLICY=PASSIVE`) remove that cliff but cost a quarter of the idle speed, and shorter spins
(`GOMP_SPINCOUNT`) kept neither. So the engine keeps spinning threads and uses fewer of them while
the cores are shared: every half second it reads the busy time of its cores (/proc/stat) less its
own CPU time, and computes on the cores that are left (at least one). A thread fewer costs a
step's parallel share; a thread too many costs the cliff, so it goes down at once and comes back up
only after two readings agree.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity mask)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return tuple(range(os.cpu_count() or 1))


def cgroup_quota(root: Path = CGROUP_ROOT, self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup and its parents, in cores (the tightest), or None.

    cgroup v2: `cpu.max` ("150000 100000" is 1.5 cores; "max 100000" is none); v1: `cpu.cfs_quota_us`
    over `cpu.cfs_period_us`. In a container the cgroup path is often "/", its root being the
    container's own."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            for folder in _up_from(root, path):
                quotas.append(_quota_v2(folder / "cpu.max"))
        elif "cpu" in controllers.split(","):
            base = root / controllers
            if not base.is_dir():
                base = root / "cpu"
            for folder in _up_from(base, path):
                quotas.append(_quota_v1(folder))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _up_from(root: Path, path: str) -> list[Path]:
    parts = [p for p in path.strip("/").split("/") if p]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _quota_v2(file: Path) -> float | None:
    try:
        quota, period = file.read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 else quota / period


def thread_ceiling(requested: int | None = None, cpus: int | None = None, quota: float | None = None,
                   omp_env: str | None = None, torch_default: int | None = None) -> int:
    """The most threads worth running: what the user asked for (`--cpu-threads`, else OMP_NUM_THREADS),
    else torch's own default; never more than the allowed CPUs or the quota rounded down (at least 1)."""
    cpus = len(allowed_cpus()) if cpus is None else cpus
    limit = max(1, min(cpus, math.floor(quota))) if quota is not None else max(1, cpus)
    if requested is None and omp_env:
        try:
            requested = int(omp_env.split(",")[0])
        except ValueError:
            requested = None
    if requested is not None:
        return max(1, min(requested, limit))
    default = torch.get_num_threads() if torch_default is None else torch_default
    return max(1, min(default, limit))


def threads_for(ceiling: int, cpus: int, others: float) -> int:
    """Threads to compute with when other processes keep `others` of our `cpus` cores busy."""
    return max(1, min(ceiling, int(cpus - others + 0.5)))


def busy_seconds(cpus: tuple[int, ...], stat: Path = Path("/proc/stat"), niced: bool | None = None) -> float:
    """Seconds the given CPUs have spent busy since boot (user, system, irq, softirq, steal; and
    nice only where this process is niced itself). A niced neighbour (a nice-19 batch job) yields
    its core to us as soon as we want it, so its time is not contention: counting it dropped the
    engine to one thread for a whole benchmark beside another session's nice-19 job. Where we run
    niced, our own time lands in `nice` and the caller subtracts it, so nice counts."""
    if niced is None:
        niced = os.getpriority(os.PRIO_PROCESS, 0) > 0
    wanted = {f"cpu{c}" for c in cpus}
    ticks = 0
    for line in stat.read_text().splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in rest.split()[:8])
            ticks += user + (nice if niced else 0) + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class ThreadGovernor:
    """On the engine thread, before each step: the thread count for the cores other processes leave us.

    `busy` and `ours` are clocks in CPU-seconds (the cores' busy time, this process's CPU time); `apply`
    sets the engine thread's count. All three are parameters so the policy is tested without a
    neighbour."""

    ceiling: int
    cpus: tuple[int, ...]
    interval: float = 0.5
    busy: Callable[[], float] | None = None
    ours: Callable[[], float] = time.process_time
    clock: Callable[[], float] = time.monotonic
    apply: Callable[[int], None] = torch.set_num_threads
    threads: int = field(init=False)
    others: float = field(init=False, default=0.0)  # cores other processes used in the last reading
    changes: int = field(init=False, default=0)
    _last: tuple[float, float, float] | None = field(init=False, default=None)
    _rising: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.busy is None:
            self.busy = lambda: busy_seconds(self.cpus)
        self.threads = self.ceiling
        self.apply(self.threads)

    @classmethod
    def for_this_process(cls, requested: int | None = None, adapt: bool = True) -> ThreadGovernor | None:
        """Set the calling thread's count to its ceiling and return a governor over this process's cores;
        None (the count stays at the ceiling) when not adapting, where one thread is all there is, or
        where /proc/stat cannot be read."""
        cpus = allowed_cpus()
        ceiling = thread_ceiling(requested, len(cpus), cgroup_quota(), os.environ.get("OMP_NUM_THREADS"))
        try:
            busy_seconds(cpus)
            readable = True
        except (OSError, ValueError):
            readable = False
        if not (adapt and readable and ceiling > 1):
            torch.set_num_threads(ceiling)
            return None
        return cls(ceiling, cpus)

    def before_step(self) -> int:
        """Read the cores every `interval` seconds and change the count if they changed hands."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.interval:
            return self.threads
        busy, ours = self.busy(), self.ours()  # type: ignore[misc]
        last, self._last = self._last, (now, busy, ours)
        if last is None:
            return self.threads
        elapsed = now - last[0]
        self.others = max(0.0, ((busy - last[1]) - (ours - last[2])) / elapsed)
        target = threads_for(self.ceiling, len(self.cpus), self.others)
        if target > self.threads:  # up only after two readings agree (a neighbour may pause briefly)
            self._rising += 1
            if self._rising < 2:
                return self.threads
        self._rising = 0
        if target != self.threads:
            logger.info("CPU threads %d -> %d (other processes use %.1f of %d cores)", self.threads, target,
                        self.others, len(self.cpus))
            self.threads = target
            self.changes += 1
            self.apply(target)
        return self.threads
