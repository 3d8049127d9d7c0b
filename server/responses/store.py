"""Stored Responses API answers: what `previous_response_id` continues and `GET /v1/responses/{id}` returns.

Each entry keeps the conversation as chat messages (for the chat template), the token ids the
model saw and wrote (prompt + output, so the next turn's prompt can start with exactly them),
and the Response object as sent. The store is bounded: at most `max_entries` (least recently
used dropped first) and each for `ttl_s` seconds; dropping an entry also releases the radix-cache
pin of its tokens (Engine.pin_prefix), so an unknown, expired or evicted id holds nothing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from server.pipeline.request import ChatMessage

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_TTL_S = 600.0


@dataclass
class StoredResponse:
    id: str
    body: dict[str, object]  # the Response object, as returned
    messages: list[ChatMessage]  # the whole conversation, this response's output included (no instructions)
    token_ids: list[int]  # prompt + output ids
    output_ids: list[int]
    frame: str  # instructions, tools and template options the ids were made under (runtime/json key)
    cache_salt: str | None = None
    expires: float = field(default=0.0)


class ResponseStore:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = DEFAULT_TTL_S,
                 on_drop: Callable[[str], None] = lambda rid: None) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._on_drop = on_drop  # releases the entry's pinned tokens
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, entry: StoredResponse) -> None:
        entry.expires = time.monotonic() + self.ttl_s
        with self._lock:
            self._expire()
            self._entries[entry.id] = entry
            self._entries.move_to_end(entry.id)
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def get(self, rid: str) -> StoredResponse | None:
        """The entry, or None when it was never stored, has expired or was evicted."""
        with self._lock:
            self._expire()
            entry = self._entries.get(rid)
            if entry is not None:
                self._entries.move_to_end(rid)
            return entry

    def delete(self, rid: str) -> bool:
        with self._lock:
            self._expire()
            if rid not in self._entries:
                return False
            self._drop(rid)
            return True

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    def _expire(self) -> None:
        now = time.monotonic()
        for rid in [r for r, e in self._entries.items() if e.expires <= now]:
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        self._entries.pop(rid, None)
        self._on_drop(rid)
