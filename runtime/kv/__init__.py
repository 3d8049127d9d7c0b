"""KV state with one owner.

The paged K/V pool (`pool.py`), the request-to-slots table (`slot_table.py`), the slot allocator
and the prefix cache (radix/) are built together by `build_kv` (`build.py`) and held by one
`KVManager` (`manager.py`), the only code that moves slots between them or changes a request's
KV fields. The model runner reads the pool and the table; the scheduler and the output processor
ask the manager.
"""

from runtime.kv.build import KVShape, build_kv, context_length
from runtime.kv.manager import KVManager
from runtime.kv.pool import KVPool, plan_kv_tokens
from runtime.kv.slot_table import ReqSlotTable

__all__ = ["KVManager", "KVPool", "KVShape", "ReqSlotTable", "build_kv", "context_length", "plan_kv_tokens"]
