"""What the KV tiers are given and what they count (runtime/kv/tiers.py keeps the copies)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GiB = 2**30


@dataclass(frozen=True)
class TierConfig:
    host_tokens: int = 0  # 0: no host tier
    disk_dir: Path | None = None  # None: no disk tier
    disk_bytes: int = 4 * GiB
    digest: str = ""  # what the KV depends on (kv_digest); names the disk folder
    host_dtype: str = "auto"  # how host copies (and disk files) hold KV: runtime/kv/host_codec.py
    copy_engine: str = "auto"  # how KV moves to and from host copies: runtime/kv/tier_copy.py

    @property
    def enabled(self) -> bool:
        return self.host_tokens > 0 or self.disk_dir is not None


@dataclass
class TierStats:
    writes: int = 0
    write_bytes: int = 0
    reads: int = 0
    corrupt: int = 0
    restored: int = 0
    prefetched: int = 0  # files read ahead of a load by the prefetch thread
