"""A bounded, paginated, JSON-able snapshot of the radix tree: what GET /cache returns and /cache/view draws.

`cache_snapshot` walks the tree depth first (namespaces' roots first, each followed by its subtree;
children in key order, so pages are stable while the tree is) and returns one page of nodes plus
totals over the whole tree per tier. It reads the tree, so it must run on the thread that owns it
(the engine loop: Engine.cache_snapshot posts it there). Keys are shown as their first few token
ids only, never as text; a namespace (cache salt) is shown by its root's id, never by the salt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000
KEY_PREVIEW_TOKENS = 8
DEFAULT_TIER = "device"  # a node without a `tier` attribute (no host/disk tiers) lives in the pool


def node_tier(node: object, tier_of: Callable[[object], str | None] | None = None) -> str:
    """The node's tier name: "device" while its KV is in the pool (`on_device`, always true
    without lower tiers), else where its lower-tier handle's KV is (`tier_of(handle)`: "host",
    "disk"), "lower" when that is not known."""
    if getattr(node, "on_device", True):
        return DEFAULT_TIER
    handle = getattr(node, "handle", None)
    return (tier_of(handle) if tier_of is not None and handle is not None else None) or "lower"


def check_page(offset: object, limit: object) -> tuple[int, int]:
    """Validate a page request; ValueError names the field."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset: must be an integer >= 0, got {offset!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit: must be an integer in [1, {MAX_LIMIT}], got {limit!r}")
    return offset, limit


def cache_snapshot(cache: object, offset: int = 0, limit: int = DEFAULT_LIMIT,
                   retained: Mapping[object, float] | None = None,
                   capacities: Mapping[str, int] | None = None, now: float | None = None,
                   tier_of: Callable[[object], str | None] | None = None,
                   tier_retained: Callable[[object], float | None] | None = None) -> dict[str, Any]:
    """One page of the tree's nodes and per-tier totals.

    cache: a RadixCache (anything without `roots()`, e.g. NoPrefixCache, has an empty tree).
    retained: node -> expiry (time.monotonic()) of retained prefixes; a node's ancestors are
        retained as long as it is (they hold its prefix), so the latest expiry is propagated up.
    capacities: tier name -> slots (tokens) that tier can hold, for the fill bars.
    tier_of: a demoted node's handle -> the lower tier holding its KV (runtime/kv/tiers.py).
    tier_retained: a demoted node's handle -> when its retention on the lower tiers ends
        (time.monotonic(); None: not retained), so host and disk nodes show theirs too.
    """
    offset, limit = check_page(offset, limit)
    now = time.monotonic() if now is None else now
    expiry = _propagate(retained or {})
    roots_of = getattr(cache, "roots", None)
    roots = list(roots_of()) if callable(roots_of) else []
    tiers: dict[str, dict[str, int]] = {name: {"nodes": 0, "tokens": 0, "capacity": int(cap)}
                                        for name, cap in (capacities or {}).items()}
    nodes: list[dict[str, Any]] = []
    index = 0
    stack = [(root, None) for root in reversed(roots)]
    while stack:
        node, parent_id = stack.pop()
        is_root = getattr(node, "parent", None) is None
        tier = node_tier(node, tier_of)
        tokens = 0 if is_root else len(node)  # type: ignore[arg-type]
        if not is_root:
            totals = tiers.setdefault(tier, {"nodes": 0, "tokens": 0, "capacity": 0})
            totals["nodes"] += 1
            totals["tokens"] += tokens
        if offset <= index < offset + limit:
            expires = expiry.get(node)
            handle = getattr(node, "handle", None)
            if tier != DEFAULT_TIER and tier_retained is not None and handle is not None:
                below = tier_retained(handle)
                expires = below if expires is None or (below is not None and below > expires) else expires
            nodes.append(_describe(node, parent_id, is_root, tier, tokens, expires, now))
        index += 1
        children = sorted(node.children.values(), key=lambda c: c.key[:KEY_PREVIEW_TOKENS].tolist())  # type: ignore[attr-defined]
        stack.extend((child, node.uid) for child in reversed(children))  # type: ignore[attr-defined]
    return {
        "offset": offset,
        "limit": limit,
        "total_nodes": index,
        "nodes": nodes,
        "tiers": tiers,
        "page_size": int(getattr(cache, "page_size", 1)),
    }


def _describe(node: Any, parent_id: int | None, is_root: bool, tier: str, tokens: int,
              expires: float | None, now: float) -> dict[str, Any]:
    return {
        "id": int(node.uid),
        "parent": parent_id,
        "namespace_root": is_root,
        "tokens": tokens,
        "key_preview": [] if is_root else [int(t) for t in node.key[:KEY_PREVIEW_TOKENS]],
        "tier": tier,
        "hits": int(getattr(node, "hit_count", 0)),
        "age_s": round(max(0.0, now - float(getattr(node, "created", now))), 3),
        "lock_ref": int(node.lock_ref),
        "children": len(node.children),
        "retained_for_s": None if expires is None else round(max(0.0, expires - now), 3),
    }


def _propagate(retained: Mapping[object, float]) -> dict[object, float]:
    """Each retained node's expiry onto its ancestors (the latest wins), roots excluded."""
    out: dict[object, float] = {}
    for node, expires in retained.items():
        current: Any = node
        while current is not None and getattr(current, "parent", None) is not None:
            if out.get(current, float("-inf")) >= expires:
                break  # this path is already marked with a later expiry
            out[current] = expires
            current = current.parent
    return out
