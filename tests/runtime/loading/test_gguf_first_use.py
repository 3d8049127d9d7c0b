"""A user's GGUF on first use and from its cache (issue #37 item 3): the header reader agrees with
gguf's own, the tokenizer is AutoTokenizer's built the fast way (every family, the same files), the
4-bit tensors are read from the GGUF itself (the same groups as a copy; fused parts side by side,
joined without a copy; a changed file refused), and a damaged cache entry is converted again,
never served."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from safetensors import safe_open

from runtime.loading import sources
from runtime.loading.default_model import build_model_dir
from runtime.loading.gguf_blocks import SafetensorsStream
from runtime.loading.gguf_file import GGUFFile
from runtime.loading.gguf_groups import INT4_GROUPS_FILE, PackedInt4Groups
from runtime.loading.gguf_int8_groups import INT8_GROUPS_FILE
from runtime.loading.gguf_refs import REFS_KEY
from runtime.loading.gguf_tokenizer import gguf_tokenizer
from runtime.loading.kept_groups import KeptGroups
from tests.tiny_gguf import write_gguf_from_hf, write_tiny_gemma3_gguf
from tests.tiny_models import save_tiny_model

Q = GGMLQuantizationType
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = ["the cat sat on the mat", "  two spaces, then\ttabs and\nnewlines", "héllo wörld ✓ 123", ""]


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def write_bpe_gguf(path: Path) -> None:
    """A header-only Qwen2 GGUF with a byte-level BPE vocabulary, merges and a ChatML template,
    and metadata of every value type (u8..f64, bool, arrays of numbers and strings)."""
    symbols = _byte_symbols()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at", "Ġ s", "Ġs at", "Ġ m", "Ġm at", "o n", "Ġ on"]
    tokens = symbols + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    writer = GGUFWriter(str(path), "qwen2")
    for add, value in ((writer.add_context_length, 128), (writer.add_embedding_length, 64), (writer.add_block_count, 1),
                       (writer.add_feed_forward_length, 96), (writer.add_head_count, 4), (writer.add_head_count_kv, 2),
                       (writer.add_layer_norm_rms_eps, 1e-6), (writer.add_rope_freq_base, 10000.0)):
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    writer.add_uint8("test.u8", 7)
    writer.add_int16("test.i16", -3)
    writer.add_uint64("test.u64", 2**40)
    writer.add_float64("test.f64", 0.125)
    writer.add_array("test.floats", [0.5, -1.5])
    writer.add_tensor("token_embd.weight", np.arange(len(tokens) * 64, dtype=np.float32).reshape(len(tokens), 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_gguf(family: str, folder: Path, kinds: dict[str, Q] | None = None) -> Path:
    path = folder / f"tiny-{family}.gguf"
    if family == "gemma3":
        write_tiny_gemma3_gguf(path, mixed=True)
    elif family == "bpe-qwen2":
        write_bpe_gguf(path)
    else:
        arch = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe"}.get(family, family)
        write_gguf_from_hf(save_tiny_model(family, folder / family), path, arch, kinds=kinds)
    return path


@pytest.mark.parametrize("family", ["gemma3", "bpe-qwen2", "llama"])
def test_the_header_reads_as_ggufreaders(family: str, tmp_path: Path) -> None:
    path = tiny_gguf(family, tmp_path, kinds={"*": Q.Q8_0, "attn_output.weight": Q.Q4_1})
    ours, theirs = GGUFFile(path), GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].contents() == field.contents(), key
        assert ours.fields[key].types == field.types and len(ours.fields[key].data) == len(field.data), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, want in zip(ours.tensors, theirs.tensors):
        assert (mine.tensor_type, list(mine.shape), mine.n_elements, mine.n_bytes, mine.data_offset) == \
            (want.tensor_type, list(want.shape), want.n_elements, want.n_bytes, want.data_offset)
        assert mine.data.dtype == want.data.dtype and np.array_equal(mine.data, want.data)


def test_a_damaged_header_is_a_clear_error(tmp_path: Path) -> None:
    good = tiny_gguf("bpe-qwen2", tmp_path)
    raw = good.read_bytes()
    for cut in (30, 2000, len(raw) - 100):  # in a key, in the token list, in the tensor data
        bad = tmp_path / f"cut-{cut}.gguf"
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match=r"cut-\d+\.gguf is a damaged GGUF file"):
            GGUFFile(bad)
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04" + raw[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(tmp_path / "zip.gguf")


@pytest.mark.parametrize("family", ["gemma3", "bpe-qwen2", "llama", "qwen3_moe", "qwen2_moe", "phi3"])
def test_the_tokenizer_is_autotokenizers(family: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = tiny_gguf(family, tmp_path)
    header = GGUFFile(path)
    name = header.fields["general.name"].contents() if "general.name" in header.fields else None
    fast = gguf_tokenizer(path, str(header.fields["general.architecture"].contents()), name)
    auto = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(fast) is type(auto)
    fast.save_pretrained(str(tmp_path / "fast"))
    auto.save_pretrained(str(tmp_path / "auto"))
    saved = sorted(p.name for p in (tmp_path / "auto").iterdir())
    assert sorted(p.name for p in (tmp_path / "fast").iterdir()) == saved
    for file_name in saved:
        assert (tmp_path / "fast" / file_name).read_bytes() == (tmp_path / "auto" / file_name).read_bytes(), file_name
    for text in TEXTS:
        ids = auto(text)["input_ids"]
        assert fast(text)["input_ids"] == ids and fast.decode(ids) == auto.decode(ids)
    assert fast.chat_template == auto.chat_template
    if family == "bpe-qwen2":
        assert fast.chat_template == CHATML and len(fast(" the cat sat")["input_ids"]) == 3  # merged: Ġthe, Ġcat, Ġsat
        chat = [{"role": "user", "content": "the cat"}]
        assert fast.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
            "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"


def test_a_users_4bit_tensors_are_read_from_the_gguf_itself(tmp_path: Path, home: Path) -> None:
    """Llama (q and k rows reordered) with q, k, gate, up Q4_0, down Q4_1, v Q8_0: the folder holds
    the 4-bit tensors' places, and they read as the copy a built-in model keeps."""
    kinds = {"*": Q.Q4_0, "ffn_down.weight": Q.Q4_1, "attn_v.weight": Q.Q8_0, "attn_output.weight": Q.Q8_0,
             "output.weight": Q.Q8_0}  # the token embedding 4-bit too
    path = tiny_gguf("llama", tmp_path, kinds=kinds)
    folder = sources.resolve_model_path(str(path))
    with safe_open(str(folder / INT4_GROUPS_FILE), framework="pt") as handle:
        assert not list(handle.keys()) and REFS_KEY in handle.metadata()
    copy = build_model_dir(path, tmp_path / "copy", progress=False)  # a built-in's way: the codes written
    refs, codes = KeptGroups(folder), KeptGroups(copy)
    assert set(refs) == set(codes)
    four_bit = [name for name in refs if isinstance(codes[name], PackedInt4Groups)]
    assert len(four_bit) == 3 * 5 + 1  # q, k, gate, up, down in 3 layers; the token embedding
    for name in sorted(refs):  # each read once: a fused part's siblings are decoded with it and kept till asked
        mine, want = refs[name], codes[name]
        for field in ("nibbles", "scales", "lows", "codes"):
            if hasattr(want, field):
                assert torch.equal(getattr(mine, field), getattr(want, field)), (name, field)
    refs = KeptGroups(folder)
    q, k = (refs[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qk")
    joined = PackedInt4Groups.concat([q, k])  # decoded side by side: joined in place
    assert joined.nibbles.data_ptr() == q.nibbles.data_ptr() and joined.scales.data_ptr() == q.scales.data_ptr()
    assert torch.equal(joined.dequantize(), torch.cat([q.dequantize(), k.dequantize()]))
    apart = PackedInt4Groups.concat([k, q])  # not in order: copied
    assert apart.nibbles.data_ptr() != k.nibbles.data_ptr() and torch.equal(apart.nibbles, torch.cat([k.nibbles, q.nibbles]))

    from runtime import Engine

    greedy = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=128) as engine:
        by_refs = engine.generate(input_ids=[[2, 100, 101, 102]], sampling_params=greedy)[0].token_ids
    with Engine(model=str(copy), dtype="float32", kv_cache_tokens=128) as engine:
        assert engine.generate(input_ids=[[2, 100, 101, 102]], sampling_params=greedy)[0].token_ids == by_refs

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the GGUF changed since
    with pytest.raises(ValueError, match=f"read from {path}, which is missing or changed"):
        KeptGroups(folder)
    assert sources.resolve_model_path(str(path)) != folder  # a changed file is a new cache entry


@pytest.mark.parametrize("damaged", [INT4_GROUPS_FILE, INT8_GROUPS_FILE, "tokenizer.json", "model.safetensors"])
def test_a_damaged_cache_entry_is_converted_again(damaged: str, tmp_path: Path, home: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_gguf("gemma3", tmp_path)  # Q4_0, Q4_1 by reference, Q5_0 and Q8_0 as codes
    folder = sources.resolve_model_path(str(path))
    whole = (folder / damaged).read_bytes()
    builds = []
    build = sources.build_model_dir
    monkeypatch.setattr(sources, "build_model_dir", lambda *a, **k: builds.append(a) or build(*a, **k))
    assert sources.resolve_model_path(str(path)) == folder and not builds  # served from the cache
    with open(folder / damaged, "r+b") as f:
        f.truncate(len(whole) // 2)
    assert sources.resolve_model_path(str(path)) == folder and len(builds) == 1  # converted again
    assert (folder / damaged).read_bytes() == whole
    KeptGroups(folder)  # whole again


def test_membership_reads_no_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_gguf("gemma3", tmp_path)
    copy = build_model_dir(path, tmp_path / "copy", progress=False)
    kept = KeptGroups(copy)
    monkeypatch.setattr(KeptGroups, "__getitem__", lambda *a: pytest.fail("read a tensor to answer `in`"))
    assert all(name in kept for name in list(kept)) and "model.layers.0.no_such.weight" not in kept


def test_a_streamed_safetensors_file_is_aligned_and_complete(tmp_path: Path) -> None:
    specs = [("a", np.dtype(np.uint8), (3, 5)), ("b", np.dtype(np.float16), (3,)), ("c", np.dtype(np.float32), (4, 2)),
             ("d", np.dtype(np.int8), (16,)), ("e", np.dtype(np.float32), (3,))]
    arrays = {key: np.arange(np.prod(shape)).astype(dtype).reshape(shape) for key, dtype, shape in specs}
    stream = SafetensorsStream(tmp_path / "x.st", specs, {"format": "test"})
    with pytest.raises(ValueError, match="out of order"):
        stream.put("d", arrays["d"])
    for key, *_ in specs:
        stream.put(key, arrays[key])
    stream.close()
    with safe_open(str(tmp_path / "x.st"), framework="np") as handle:
        assert handle.metadata() == {"format": "test"}
        for key, array in arrays.items():
            assert np.array_equal(handle.get_tensor(key), array)
    header_size = int.from_bytes((tmp_path / "x.st").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "x.st").read_bytes()[8:8 + header_size])
    for key, dtype, _ in specs:
        assert (8 + header_size + header[key]["data_offsets"][0]) % dtype.itemsize == 0, key
    unfinished = SafetensorsStream(tmp_path / "y.st", specs, {})
    with pytest.raises(ValueError, match="never written"):
        unfinished.close()
