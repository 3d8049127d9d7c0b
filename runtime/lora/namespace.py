"""The prefix cache's namespace key (a request's `extra_key`), tagged so that namespaces never collide.

A base-model request keys its prefixes by its cache salt alone, as before: None, or the salt string.
A request through a LoRA adapter keys them by a `LoraNamespace`: the salt and the adapter's identity
(name + digest of its files: runtime/lora/adapter.py), as one frozen value of its own type. A string
never equals it, so no salt (not even one spelled like an adapter's name) reaches adapter KV, a base
request never does, and an adapter reloaded under its old name with other weights has a new digest,
hence a new namespace. The radix cache gives each namespace its own root (radix/radix_cache.py).

The disk tier writes keys into JSON headers (runtime/kv/kv_files.py): `to_json` / `from_json` keep
the tag there too (a dict marked "lora"; a salt stays a plain string), so a restart keeps them apart.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass

from runtime.lora.adapter import AdapterIdentity


@dataclass(frozen=True)
class LoraNamespace:
    salt: str | None
    adapter: AdapterIdentity


def cache_key(salt: str | None, adapter: AdapterIdentity | None) -> Hashable | None:
    """A request's prefix-cache namespace: its salt alone, or the salt and its adapter, tagged."""
    return salt if adapter is None else LoraNamespace(salt, adapter)


def to_json(key: object) -> object:
    if isinstance(key, LoraNamespace):
        return {"kind": "lora", "salt": key.salt, "name": key.adapter.name, "digest": key.adapter.digest}
    return key


def from_json(value: object) -> Hashable | None:
    """A key as `to_json` wrote it; ValueError for anything else but a string or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("kind") == "lora":
        salt, name, digest = value.get("salt"), value.get("name"), value.get("digest")
        if (salt is None or isinstance(salt, str)) and isinstance(name, str) and isinstance(digest, str):
            return LoraNamespace(salt, AdapterIdentity(name, digest))
    raise ValueError(f"not a prefix-cache namespace: {value!r}")


def key_bytes(key: object) -> bytes:
    """A namespace as bytes for a digest, each kind behind its own tag (no salt spells another kind)."""
    if key is None:
        return b"\x00"
    if isinstance(key, str):
        return b"\x01" + key.encode()
    return b"\x02" + json.dumps(to_json(key), sort_keys=True).encode()
