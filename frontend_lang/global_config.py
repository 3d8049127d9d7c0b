"""`sgl.global_config`: SGLang's interpreter settings object, with the settings that mean something here.

Programs that set SGLang's other attributes keep working (they are plain attributes); only
these are read: `enable_precache_with_tracing` (run_batch computes the prefix its items share
once, first) and `verbosity` (>= 2 prints each finished program's text, as SGLang does).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GlobalConfig:
    verbosity: int = 0
    enable_precache_with_tracing: bool = True
    # Read by SGLang's own interpreter and backends; accepted here so programs that set them run.
    default_backend: object = None
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    enable_parallel_encoding: bool = True


global_config = GlobalConfig()
