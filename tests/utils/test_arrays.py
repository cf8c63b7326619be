"""Page-aligned host arrays: where they start, what they hold, and what they fall back to."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from emote_core.utils.arrays import PAGE_BYTES, aligned_empty


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64, np.bool_, np.float16])
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5), (1000, 32), (7, 2, 3)])
def test_arrays_start_on_a_page_and_have_the_shape_and_dtype_asked_for(shape, dtype):
    array = aligned_empty(shape, dtype)
    assert array.shape == shape
    assert array.dtype == np.dtype(dtype)
    assert array.flags.c_contiguous and array.flags.writeable
    assert array.size == 0 or array.ctypes.data % PAGE_BYTES == 0  # no bytes: no address


def test_an_int_shape_and_other_alignments():
    assert aligned_empty(10, np.float64).shape == (10,)
    for alignment in (1, 64, 1 << 16):
        assert aligned_empty((100, 3), np.float32, alignment).ctypes.data % alignment == 0


@pytest.mark.parametrize("alignment", [0, -64, 48])
def test_an_alignment_that_is_not_a_power_of_two_is_refused(alignment):
    with pytest.raises(ValueError, match="power of two"):
        aligned_empty((4,), np.float32, alignment)


def test_the_buffer_lives_as_long_as_the_array_and_torch_shares_it():
    array = aligned_empty((5000, 8), np.float32)
    array[:] = np.arange(40_000, dtype=np.float32).reshape(5000, 8)
    tensor = torch.from_numpy(array)
    del array
    gc.collect()
    _ = [np.full(5000 * 8, -1.0, np.float32) for _ in range(8)]  # reuse of freed memory
    assert torch.equal(tensor, torch.arange(40_000, dtype=torch.float32).reshape(5000, 8))
    tensor[0, 0] = 7.0
    assert tensor.numpy().base is not None and tensor.numpy()[0, 0] == 7.0


def test_dtypes_that_cannot_view_bytes_come_from_numpy_empty():
    objects = aligned_empty((3,), object)
    assert objects.dtype == np.dtype(object) and objects.shape == (3,)
    empty_items = aligned_empty((2,), np.dtype("V0"))
    assert empty_items.shape == (2,)
