"""The per-file allocation budget: what a file may make a reader allocate, and the refusal."""

from __future__ import annotations

import psutil
import pytest

from emote_core.errors import FormatError
from emote_core.stores.budget import SIZE_FLOOR, SIZE_RATIO, AllocationBudget, nested_size


def test_a_small_file_may_expand_64_times_plus_the_floor():
    budget = AllocationBudget("a.pkl", 1000)
    assert budget.limit == SIZE_RATIO * 1000 + SIZE_FLOOR and not budget.memory_bound
    budget.charge("first", budget.limit - 10)
    with pytest.raises(FormatError) as refused:
        budget.charge("member 'x.npy'", 11, "shape (11,) of uint8")
    text = str(refused.value)
    assert text.startswith("a.pkl: member 'x.npy' declares 11 bytes (shape (11,) of uint8)")
    assert f"with {budget.limit - 10:,} declared before it" in text and "\n" not in text


def test_a_huge_file_is_bounded_by_half_the_free_memory():
    size = psutil.virtual_memory().total  # 64x this is far beyond what is free
    budget = AllocationBudget("big.pt", size)
    assert budget.memory_bound and budget.limit < size
    with pytest.raises(FormatError, match="50% of the memory available — free memory or read"):
        budget.charge("tensor 'obs'", budget.limit + 1)


def test_nested_lists_count_every_appearance_of_a_shared_list():
    row = [0.5] * 1000
    assert nested_size([row] * 1000) == (1_000_000, 8_000_000)
    looped: list = [1.0]
    looped.append(looped)
    with pytest.raises(FormatError, match="holds a list that contains itself"):
        nested_size(looped, member="the observations list", source="data.pkl")
