"""The disk tier's files: one file per cached run of tokens, and the digest that names their folder.

A file is `MAGIC`, an 8-byte header length, a JSON header (the folder's digest, the run's key, whose
namespace keeps its tag: runtime/lora/namespace.py, the encoding, the shape, the block size and the SHA-256 of each block) and the payload: blocks of
`BLOCK_TOKENS` tokens, each holding the HostCopy's tensors for its tokens in file order. It is
written to a temporary name and renamed, so a reader sees all of it or none; a torn, truncated,
flipped or foreign file reads as None (and goes), never as KV.

Blocks let a file be read in part (`DiskRun`: a run of its tokens): a copy split in two (a prompt
shares only the first part of a demoted node) keeps both parts in the same file, and a read of
a part reads and checks only the blocks it covers. Files of the first format (`RSKV1`: one
checksum over part-major tensors) are read as one block.
runtime/kv/tiers.py decides which runs are written, read and dropped; this file only holds the
format.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from radix.tiers import StoredKey
from runtime.kv.host_codec import HostCodec, HostCopy
from runtime.lora.namespace import from_json, to_json

logger = logging.getLogger(__name__)
MAGIC = b"RSKV2\n"
MAGIC_V1 = b"RSKV1\n"  # one checksum over the whole payload: read as a single block
BLOCK_TOKENS = 16  # tokens per checksummed block (a part of a file is read by whole blocks)


@dataclass(frozen=True)
class DiskRun:
    """Tokens [first, first + count) of the run a file holds (`file_tokens`, `file_bytes` in all)."""

    path: Path
    first: int
    count: int
    file_tokens: int
    file_bytes: int

    def part(self, start: int, stop: int) -> DiskRun:
        """Tokens [start, stop) of this run, in the same file."""
        assert 0 <= start < stop <= self.count
        return DiskRun(self.path, self.first + start, stop - start, self.file_tokens, self.file_bytes)

    @property
    def share(self) -> int:
        """The file's bytes this run accounts for (the whole file's, for the whole run)."""
        return self.file_bytes * self.count // self.file_tokens


def write_kv_file(folder: Path, digest: str, key: StoredKey, encoding: str, copy: HostCopy,
                  block_tokens: int = BLOCK_TOKENS) -> DiskRun:
    """Write one run's copy under a fresh name in `folder`; the whole run, in that file."""
    parts = copy.wait().parts()
    tokens = copy.tokens
    blocks = [b"".join(_tensor_bytes(t[:, b : b + block_tokens]) for t in parts) for b in range(0, tokens, block_tokens)]
    header = json.dumps({
        "digest": digest, "extra_key": to_json(key.extra_key), "path": key.path.tolist(),
        "start": key.start, "dtype": encoding, "shape": list(copy.k.shape), "block_tokens": block_tokens,
        "block_sha256": [hashlib.sha256(block).hexdigest() for block in blocks]}).encode()
    path = folder / f"{uuid.uuid4().hex}.kv"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(MAGIC + len(header).to_bytes(8, "little") + header)
        for block in blocks:
            out.write(block)
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    return DiskRun(path, 0, tokens, tokens, path.stat().st_size)


RETAINED_FILE = "retained.json"  # the live retentions (tier_retention.py), beside the files


def write_retained(folder: Path, saved: list[dict[str, object]]) -> None:
    """Replace the folder's record of retentions (atomically, like the KV files)."""
    tmp = folder / (RETAINED_FILE + ".tmp")
    saved = [{**item, "extra_key": to_json(item.get("extra_key"))} for item in saved]
    tmp.write_text(json.dumps({"version": 1, "retained": saved}))
    os.replace(tmp, folder / RETAINED_FILE)


def read_retained(folder: Path) -> list[dict[str, object]]:
    """The retentions recorded in a folder; none when there is no record (a folder written before
    retention was saved) or it is damaged."""
    try:
        data = json.loads((folder / RETAINED_FILE).read_text())
        saved = data["retained"]
        return [{**item, "extra_key": from_json(item.get("extra_key"))} for item in saved
                if isinstance(item, dict)] if isinstance(saved, list) else []
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("KV disk tier: %s is damaged; retentions before the restart are lost", RETAINED_FILE)
        return []


def read_kv_key(path: Path, digest: str, encoding: str) -> StoredKey | None:
    """The run a file holds, from its header alone; None for a file of another folder or encoding
    (written with another --kv-host-tier-dtype), or one whose header is damaged."""
    try:
        with open(path, "rb") as f:
            header = _read_header(f)
    except OSError:
        return None
    if header is None or header.get("digest") != digest or header.get("dtype") != encoding:
        return None
    try:
        return StoredKey(from_json(header["extra_key"]), np.asarray(header["path"], dtype=np.int64),
                         int(header["start"]))
    except (KeyError, TypeError, ValueError):
        return None


def read_kv_file(path: Path, codec: HostCodec, first: int = 0, count: int | None = None) -> HostCopy | None:
    """Tokens [first, first + count) of the file's KV (all of them by default) if the file is
    whole, of this codec's encoding, and the checksums of the blocks they lie in hold; None
    otherwise (and the file goes: a damaged block is never served, whichever run reads it).
    The blocks read are checked and viewed in place: a read of one block copies no KV."""
    try:
        with open(path, "rb") as f:
            found = _layout(f, os.fstat(f.fileno()).st_size, codec)
            if found is None:
                raise ValueError("not a whole file of this encoding")
            start, shape, sizes, block, hashes = found
            tokens = shape[1]
            count = tokens - first if count is None else count
            if not (0 <= first and 0 < count and first + count <= tokens):
                raise ValueError(f"tokens [{first}, {first + count}) of a {tokens}-token file")
            i0, i1 = first // block, -(-(first + count) // block)
            per_token = sum(sizes)
            f.seek(start + i0 * block * per_token)
            data = bytearray((min(i1 * block, tokens) - i0 * block) * per_token)
            if f.readinto(data) != len(data):
                raise ValueError("short read")
    except (OSError, ValueError):
        logger.warning("KV disk tier: %s is corrupt, torn or of another encoding; its prefix will be recomputed",
                       path.name)
        path.unlink(missing_ok=True)
        return None
    view = memoryview(data)
    pieces: list[list[torch.Tensor]] = [[] for _ in sizes]
    offset = 0
    for i in range(i0, i1):
        n = min(block, tokens - i * block)  # the last block may be short
        if hashlib.sha256(view[offset : offset + n * per_token]).hexdigest() != hashes[i]:
            logger.warning("KV disk tier: block %d of %s is corrupt; its prefix will be recomputed", i, path.name)
            path.unlink(missing_ok=True)
            return None
        for p, ((dtype, part_shape), size) in enumerate(zip(codec.layout(shape), sizes)):
            # viewed in place (the buffer is ours alone): no copy of the KV on the way
            t = torch.frombuffer(data, dtype=torch.uint8, count=n * size, offset=offset)
            pieces[p].append(t.view(dtype).reshape(part_shape[0], n, *part_shape[2:]))
            offset += n * size
    skip = first - i0 * block
    parts = [(p[0] if len(p) == 1 else torch.cat(p, dim=1))[:, skip : skip + count] for p in pieces]
    return HostCopy(*parts)


def _layout(f: object, size: int, codec: HostCodec) -> tuple[int, tuple[int, ...], list[int], int, list[str]] | None:
    """From an open file's header: where the payload starts, the K/V shape, each part's bytes per
    token, the block size and the blocks' checksums; None for a file that is not a whole one of
    this codec's encoding (a damaged header, a payload of the wrong size: torn or truncated)."""
    header = _read_header(f)
    if header is None or header.get("dtype") != codec.name:
        return None
    try:
        shape = tuple(int(d) for d in header["shape"])
        layout = codec.layout(shape)
        sizes = [int(np.prod(s[:1] + s[2:])) * torch.empty(0, dtype=d).element_size() for d, s in layout]
        if header["magic"] == MAGIC_V1:
            block, hashes = shape[1], [str(header["sha256"])]
        else:
            block, hashes = int(header["block_tokens"]), [str(h) for h in header["block_sha256"]]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    start = int(header["payload"])
    if block < 1 or shape[1] < 1 or len(hashes) != -(-shape[1] // block) or size - start != shape[1] * sum(sizes):
        return None
    return start, shape, sizes, block, hashes


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _read_header(f: object) -> dict | None:
    """The JSON header of an open file (either format), with `magic` and `payload` (where the
    payload starts) added; None when it is not one of ours or is damaged."""
    try:
        head = f.read(len(MAGIC) + 8)  # type: ignore[attr-defined]
        magic = bytes(head[: len(MAGIC)])
        if magic not in (MAGIC, MAGIC_V1) or len(head) != len(MAGIC) + 8:
            return None
        size = int.from_bytes(head[len(MAGIC) :], "little")
        raw = f.read(size)  # type: ignore[attr-defined]
        if len(raw) != size:
            return None
        header = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    header.update(magic=magic, payload=len(MAGIC) + 8 + size)
    return header


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
