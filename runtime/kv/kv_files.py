"""The disk tier's files: one file per cached run of tokens, and the digest that names their folder.

A file is `MAGIC`, an 8-byte header length, a JSON header (the folder's digest, the run's key,
the encoding, the shape, the SHA-256 of the payload) and the payload: the HostCopy's tensors in
file order. It is written to a temporary name and renamed, so a reader sees all of it or none;
a torn, truncated, flipped or foreign file reads as None (and goes), never as KV.
runtime/kv/tiers.py decides which runs are written, read and dropped; this file only holds the
format.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path

import numpy as np
import torch

from radix.tiers import StoredKey
from runtime.kv.host_codec import HostCodec, HostCopy

logger = logging.getLogger(__name__)
MAGIC = b"RSKV1\n"


def write_kv_file(folder: Path, digest: str, key: StoredKey, encoding: str, copy: HostCopy) -> Path:
    """Write one run's copy under a fresh name in `folder`; returns its path."""
    payload = b"".join(_tensor_bytes(t) for t in copy.wait().parts())
    header = json.dumps({
        "digest": digest, "extra_key": key.extra_key, "path": key.path.tolist(),
        "start": key.start, "dtype": encoding, "shape": list(copy.k.shape),
        "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    path = folder / f"{uuid.uuid4().hex}.kv"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(MAGIC + len(header).to_bytes(8, "little") + header + payload)
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    return path


RETAINED_FILE = "retained.json"  # the live retentions (tier_retention.py), beside the files


def write_retained(folder: Path, saved: list[dict[str, object]]) -> None:
    """Replace the folder's record of retentions (atomically, like the KV files)."""
    tmp = folder / (RETAINED_FILE + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "retained": saved}))
    os.replace(tmp, folder / RETAINED_FILE)


def read_retained(folder: Path) -> list[dict[str, object]]:
    """The retentions recorded in a folder; none when there is no record (a folder written before
    retention was saved) or it is damaged."""
    try:
        data = json.loads((folder / RETAINED_FILE).read_text())
        saved = data["retained"]
        return [item for item in saved if isinstance(item, dict)] if isinstance(saved, list) else []
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("KV disk tier: %s is damaged; retentions before the restart are lost", RETAINED_FILE)
        return []


def read_kv_key(path: Path, digest: str, encoding: str) -> StoredKey | None:
    """The run a file holds, from its header alone; None for a file of another folder or encoding
    (written with another --kv-host-tier-dtype), or one whose header is damaged."""
    header = _read_header(path)
    if header is None or header.get("digest") != digest or header.get("dtype") != encoding:
        return None
    try:
        return StoredKey(header["extra_key"], np.asarray(header["path"], dtype=np.int64), int(header["start"]))
    except (KeyError, TypeError, ValueError):
        return None


def read_kv_file(path: Path, codec: HostCodec) -> HostCopy | None:
    """The file's KV if it is whole, of this codec's encoding and its checksum holds; None
    otherwise (and it goes).
    Read once into one buffer, checked and viewed in place: no copies of the KV on the way."""
    try:
        data = bytearray(path.stat().st_size)
        with open(path, "rb") as f:
            if f.readinto(data) != len(data):
                raise OSError("short read")
    except OSError:
        return None
    view = memoryview(data)
    header = _read_header(path, view)
    if header is None:
        path.unlink(missing_ok=True)
        return None
    start = len(MAGIC) + 8 + int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "little")
    try:
        layout = codec.layout(tuple(int(d) for d in header["shape"]))
    except (KeyError, TypeError, ValueError):
        layout = []
    sizes = [int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size() for dtype, shape in layout]
    if header.get("dtype") != codec.name or not layout or sum(sizes) != len(data) - start \
            or hashlib.sha256(view[start:]).hexdigest() != header.get("sha256"):
        logger.warning("KV disk tier: %s is corrupt, torn or of another encoding; its prefix will be recomputed",
                       path.name)
        path.unlink(missing_ok=True)
        return None
    parts = []
    for (dtype, shape), size in zip(layout, sizes):
        # viewed in place (the buffer is ours alone): no copy of the KV on the way
        parts.append(torch.frombuffer(data, dtype=torch.uint8, count=size, offset=start).view(dtype).reshape(shape))
        start += size
    return HostCopy(*parts)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _read_header(path: Path, data: bytes | memoryview | None = None) -> dict | None:
    try:
        if data is None:
            with open(path, "rb") as f:
                data = f.read(len(MAGIC) + 8)
                if data[: len(MAGIC)] != MAGIC:
                    return None
                size = int.from_bytes(data[len(MAGIC) :], "little")
                raw = f.read(size)
        else:
            if bytes(data[: len(MAGIC)]) != MAGIC:
                return None
            size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
            raw = bytes(data[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
        if len(raw) != size:
            return None
        header = json.loads(raw)
        return header if isinstance(header, dict) else None
    except (OSError, ValueError):
        return None


def kv_digest(model_path: Path, dtype: torch.dtype, page_size: int, load_format: str,
              encoding: str | None = None) -> str:
    """A name for everything the KV of a prefix depends on: the weights (sampled: the safetensors
    headers and sizes plus 64 KiB at 16 places in each file), the config (rotary settings, sizes),
    the tokenizer files, the KV dtype, the page size, and how files hold it (`encoding`, the host
    tier's dtype, when it is not the KV dtype). Random (dummy) weights get a random name: their KV
    must never be found again."""
    h = hashlib.sha256(f"radixserve-kv-v1|{dtype}|{page_size}".encode())
    if encoding is not None and encoding != str(dtype).removeprefix("torch."):
        h.update(f"|encoding={encoding}".encode())
    if load_format == "dummy":
        h.update(os.urandom(16))
    for path in sorted(Path(model_path).iterdir()):
        if path.suffix == ".safetensors":
            size = path.stat().st_size
            h.update(f"{path.name}|{size}".encode())
            with open(path, "rb") as f:
                for i in range(16):
                    f.seek(size * i // 16)
                    h.update(f.read(65536))
        elif path.name in ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                           "special_tokens_map.json", "chat_template.jinja"):
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:24]
