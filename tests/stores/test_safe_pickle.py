"""The restricted unpickler: plain data and upstream objects load, everything else is refused."""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from emote_core.errors import FormatError, UnsafePickleError
from emote_core.stores.safe_pickle import (
    UpstreamObject,
    UpstreamStorage,
    read_npy,
    safe_load,
    safe_loads,
    upstream_name,
)

PLAIN_DATA = {
    "float32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "bools": np.array([True, False]),
    "scalar": np.float32(1.5),
    "int_scalar": np.int64(-7),
    "dtype": np.dtype("f4"),
    "types": [np.float32, np.bool_, np.uint8, bool, float, int],
    "objects": np.array([{"a": np.arange(2)}], dtype=object),
    "containers": [{1, 2}, frozenset({3}), bytearray(b"xy"), b"raw", 1 + 2j, slice(1, 5)],
    "deque": collections.deque([3, 1, 2], maxlen=5),
    "ordered": collections.OrderedDict(b=1, a=2),
}


def _equal(left, right) -> bool:
    if isinstance(left, np.ndarray):
        return (
            isinstance(right, np.ndarray)
            and left.dtype == right.dtype
            and left.shape == right.shape
            and all(_equal(a, b) for a, b in zip(left.ravel(), right.ravel(), strict=True))
        )
    if isinstance(left, dict):
        return (
            type(left) is type(right)
            and left.keys() == right.keys()
            and all(_equal(left[k], right[k]) for k in left)
        )
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(
            _equal(a, b) for a, b in zip(left, right, strict=True)
        )
    return type(left) is type(right) and left == right


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_numpy_and_container_data_loads_like_pickle_would(protocol):
    data = pickle.dumps(PLAIN_DATA, protocol=protocol)
    loaded = safe_loads(data)
    assert _equal(loaded, pickle.loads(data))
    assert loaded["deque"].maxlen == 5


def test_numpy_1_spellings_of_the_reconstruct_functions_are_accepted():
    data = pickle.dumps([np.arange(3.0), np.float32(2.0)], protocol=2)
    numpy1 = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert numpy1 != data
    loaded = safe_loads(numpy1)
    assert loaded[0].tolist() == [0.0, 1.0, 2.0] and loaded[1] == np.float32(2.0)


def test_safe_load_reads_a_file_object():
    assert safe_load(io.BytesIO(pickle.dumps({"x": 1}))) == {"x": 1}


@pytest.fixture
def fake_upstream(monkeypatch):
    """Classes registered under upstream emote's module names, only to *write* test pickles."""
    storage = types.ModuleType("emote.memory.storage")
    column = types.ModuleType("emote.memory.column")

    class BaseStorage(dict):
        def __init__(self, shape, dtype):
            self._shape, self._dtype, self._temp_storage = shape, dtype, None

    class SyntheticDones:
        @staticmethod
        def as_mask(storage, shape, dtype):
            raise AssertionError("never called")

    @dataclass
    class VirtualColumn:
        name: str
        shape: tuple
        dtype: type
        target_name: str
        mapper: object

    for owner, cls in ((storage, BaseStorage), (storage, SyntheticDones), (column, VirtualColumn)):
        cls.__module__ = owner.__name__
        cls.__qualname__ = cls.__name__
        setattr(owner, cls.__name__, cls)
    SyntheticDones.as_mask.__qualname__ = "SyntheticDones.as_mask"
    SyntheticDones.as_mask.__module__ = storage.__name__
    for name in ("emote", "emote.memory"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, storage.__name__, storage)
    monkeypatch.setitem(sys.modules, column.__name__, column)
    return BaseStorage, SyntheticDones, VirtualColumn


def test_upstream_objects_become_inert_stand_ins(fake_upstream, monkeypatch):
    BaseStorage, SyntheticDones, VirtualColumn = fake_upstream
    storage = BaseStorage((3,), np.float32)
    storage[2**64 - 3] = np.ones((2, 3), dtype=np.float32)
    masks = VirtualColumn("masks", (1,), np.float32, "actions", SyntheticDones.as_mask)
    data = pickle.dumps({"storage": storage, "masks": masks}, protocol=4)
    for name in ("emote", "emote.memory", "emote.memory.storage", "emote.memory.column"):
        monkeypatch.delitem(sys.modules, name)

    loaded = safe_loads(data)
    restored = loaded["storage"]
    assert isinstance(restored, UpstreamStorage)
    assert upstream_name(restored) == "emote.memory.storage.BaseStorage"
    assert restored._shape == (3,) and restored._dtype is np.float32
    assert restored[2**64 - 3].tolist() == [[1.0, 1.0, 1.0]] * 2
    column = loaded["masks"]
    assert isinstance(column, UpstreamObject)
    assert (column.name, column.target_name, column.dtype) == ("masks", "actions", np.float32)
    assert upstream_name(column.mapper) == "emote.memory.storage.SyntheticDones.as_mask"
    with pytest.raises(TypeError, match=r"read-only stand-in"):
        pickle.dumps(column)


def test_a_stand_in_refuses_dunder_attributes(fake_upstream, monkeypatch):
    _, _, VirtualColumn = fake_upstream
    sneaky = VirtualColumn("x", (), float, "y", None)
    sneaky.__dict__["__class__"] = "replaced"
    data = pickle.dumps(sneaky, protocol=4)
    for name in ("emote", "emote.memory", "emote.memory.storage", "emote.memory.column"):
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UnsafePickleError, match=r"'__class__'"):
        safe_loads(data)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("os", "system"),
        ("posix", "system"),
        ("builtins", "eval"),
        ("builtins", "exec"),
        ("builtins", "getattr"),
        ("builtins", "__import__"),
        ("subprocess", "Popen"),
        ("subprocess", "check_output"),
        ("numpy", "load"),
        ("numpy.testing", "assert_equal"),
        ("emote.memory.table", "ArrayTable"),
        ("never_installed_module", "anything"),
    ],
)
def test_every_global_outside_the_allowlist_is_refused_by_name(module, name, tmp_path):
    marker = tmp_path / "ran"
    data = f"c{module}\n{name}\n(S'touch {marker}'\ntR.".encode()
    with pytest.raises(UnsafePickleError, match=rf"'{module}.{name}'"):
        safe_loads(data)
    assert not marker.exists()
    assert "never_installed_module" not in sys.modules


def test_codecs_encode_only_decodes_latin1():
    assert safe_loads(pickle.dumps(b"\x00\xff", protocol=2)) == b"\x00\xff"
    hostile = b"c_codecs\nencode\n(Vx\nVrot13\ntR."
    with pytest.raises(UnsafePickleError, match=r"only 'latin1'"):
        safe_loads(hostile)


def test_persistent_ids_are_refused():
    buffer = io.BytesIO()

    class Persisting(pickle.Pickler):
        def persistent_id(self, obj):
            return "handle" if obj == "secret" else None

    Persisting(buffer, protocol=4).dump(["secret"])
    with pytest.raises(UnsafePickleError, match=r"persistent id 'handle'"):
        safe_loads(buffer.getvalue())


def test_damaged_pickles_are_format_errors_not_crashes():
    data = pickle.dumps({"a": np.arange(10)}, protocol=4)
    with pytest.raises(FormatError, match=r"not a readable pickle") as caught:
        safe_loads(data[: len(data) // 2])
    assert not isinstance(caught.value, UnsafePickleError)


def test_trust_uses_plain_pickle():
    data = pickle.dumps(Fraction(1, 3))
    with pytest.raises(UnsafePickleError, match=r"'fractions.Fraction'"):
        safe_loads(data)
    assert safe_loads(data, trust=True) == Fraction(1, 3)


def _npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_read_npy_reads_plain_arrays_of_every_header_version(version):
    array = np.arange(12, dtype=">i4").reshape(3, 4)
    loaded = read_npy(_npy(array, version))
    assert loaded.dtype == array.dtype and loaded.tolist() == array.tolist()
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    assert read_npy(_npy(fortran)).tolist() == fortran.tolist()


def test_read_npy_unpickles_object_arrays_only_through_the_allowlist(tmp_path):
    assert read_npy(_npy(np.array({"k": np.arange(2)}, dtype=object)))[()]["k"].tolist() == [0, 1]
    hostile = _npy(np.array(Fraction(1, 2), dtype=object))
    with pytest.raises(UnsafePickleError, match=r"'fractions.Fraction'"):
        read_npy(hostile)
    with pytest.raises(FormatError, match=r"holds pickled objects"):
        read_npy(hostile, objects=False)


def test_read_npy_refuses_truncated_and_foreign_bytes():
    data = _npy(np.arange(100.0))
    with pytest.raises(FormatError, match=r"truncated"):
        read_npy(data[:-8])
    with pytest.raises(FormatError, match=r"not a readable .npy"):
        read_npy(b"PK\x03\x04 not numpy")


@pytest.mark.parametrize(
    "target",
    [
        "_codecs\nencode",
        "numpy\nfloat32",
        "collections\nOrderedDict",
        "emote.memory.column\nColumn",
    ],
)
def test_a_pickle_cannot_set_attributes_on_the_shared_allowed_objects(target):
    build = f"c{target}\n(dS'encoding'\nS'rot13'\nsb.".encode()  # GLOBAL, then BUILD on it
    with pytest.raises(FormatError):
        safe_loads(build)
    assert safe_loads(pickle.dumps(b"still latin1", protocol=2)) == b"still latin1"


class _Calls:
    """Pickles as ``func(*args)``: how a hostile pickle asks an allowlisted global to allocate."""

    def __init__(self, func, *args) -> None:
        self.call = (func, args)

    def __reduce__(self):
        return self.call


def _small_budget():
    from emote_core.stores.budget import AllocationBudget

    return AllocationBudget("hostile.pkl", 200, limit=1 << 20)


_SHARED_ROW = [0.5] * 1024
ALLOCATING_CALLS = {
    "bytearray": (_Calls(bytearray, 64 << 20), "a pickled bytearray declares 67,108,864"),
    "ndarray": (_Calls(np.ndarray, (8 << 20,), np.float64), "numpy.ndarray call declares"),
    "reconstruct": (
        _Calls(np._core.multiarray._reconstruct, np.ndarray, (64 << 20,), b"b"),
        "a pickled numpy array declares 67,108,864",
    ),
    "scalar-of-shared-lists": (
        _Calls(np.float64, [[_SHARED_ROW] * 64] * 128),  # one row pickled, used 8192 times
        "numpy.float64 call declares 67,108,864",
    ),
}


@pytest.mark.parametrize("case", list(ALLOCATING_CALLS))
def test_allowlisted_calls_are_charged_to_the_budget_before_they_allocate(case):
    import tracemalloc

    call, message = ALLOCATING_CALLS[case]
    data = pickle.dumps([call], protocol=4)
    assert len(data) < 16 << 10
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=message) as refused:
            safe_loads(data, budget=_small_budget())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value).startswith("hostile.pkl: ") and "\n" not in str(refused.value)
    assert peak < 8 << 20, f"{peak:,} bytes allocated to refuse it"


def test_an_object_array_state_is_charged_by_its_declared_shape():
    import pickletools

    # An object array's state lists its items; numpy allocates the declared shape first.
    legit = pickle.dumps(np.array([None, None], dtype=object), protocol=2)
    hostile = legit.replace(b"K\x02\x85", b"J" + (8 << 20).to_bytes(4, "little") + b"\x85")
    assert hostile != legit and pickletools.dis(hostile, out=io.StringIO()) is None
    with pytest.raises(FormatError, match=r"a pickled numpy array declares 67,108,864 bytes"):
        safe_loads(hostile, budget=_small_budget())


@pytest.mark.parametrize(
    "declared",
    [
        b"\x80\x04\x96" + (64 << 20).to_bytes(8, "little") + b"abc.",  # BYTEARRAY8
        b"\x80\x04\x8e" + (64 << 20).to_bytes(8, "little") + b"abc.",  # BINBYTES8
        b"\x80\x02N" + b"r" + (8 << 20).to_bytes(4, "little") + b".",  # LONG_BINPUT: memo index
    ],
    ids=["bytearray8", "binbytes8", "memo-index"],
)
def test_declared_lengths_and_memo_indexes_allocate_nothing(declared):
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            safe_loads(declared)
        except FormatError as error:
            assert "\n" not in str(error)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes allocated for a {len(declared)}-byte pickle"


def test_legitimate_pickles_stay_within_their_budget():
    rows = np.arange(1 << 16, dtype=np.float32).reshape(-1, 4)
    data = pickle.dumps({"obs": rows, "list": [rows[0]] * 100, "blob": bytearray(1000)}, 5)
    loaded = safe_loads(data)
    assert np.array_equal(loaded["obs"], rows) and loaded["blob"] == bytearray(1000)
