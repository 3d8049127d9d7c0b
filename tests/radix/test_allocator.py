"""SlotAllocator: whole pages out, whole pages back, and loud failures on misuse."""

from __future__ import annotations

import pytest
import torch

from radix import SlotAllocator


def test_alloc_and_free_round_trip() -> None:
    alloc = SlotAllocator(8)
    a = alloc.alloc(3)
    assert a is not None and a.dtype == torch.int64 and len(set(a.tolist())) == 3
    assert alloc.available() == 5
    assert alloc.alloc(6) is None  # no partial allocation
    alloc.free(a)
    assert alloc.available() == 8


def test_pages_are_contiguous_and_aligned() -> None:
    alloc = SlotAllocator(16, page_size=4)
    a = alloc.alloc(8)
    assert a is not None
    pages = a.view(-1, 4)
    assert (pages[:, 0] % 4 == 0).all() and (pages.diff(dim=1) == 1).all()
    with pytest.raises(ValueError, match="multiple of page_size"):
        alloc.alloc(3)
    with pytest.raises(ValueError, match="whole pages"):
        alloc.free(a[:2])
    alloc.free(a)
    assert alloc.available() == 16


def test_double_free_and_foreign_free_raise() -> None:
    alloc = SlotAllocator(4)
    a = alloc.alloc(2)
    assert a is not None
    alloc.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(torch.tensor([3]))
    with pytest.raises(ValueError):
        alloc.free(torch.tensor([7]))
    b = alloc.alloc(2)
    assert b is not None
    with pytest.raises(ValueError, match="twice"):
        alloc.free(torch.cat([b[:1], b[:1]]))
    assert alloc.available() == 2  # a failed free changes nothing


def test_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError):
        SlotAllocator(10, page_size=4)
    with pytest.raises(ValueError):
        SlotAllocator(8, page_size=0)
