"""The one place emote unpickles: a restricted unpickler with an allowlist of globals.

A pickle is a program, so files from other tools are read with :class:`RestrictedUnpickler`: it
resolves only numpy's reconstruction functions and scalar types, the builtins and containers of
plain data, and the classes upstream emote and peers' replay files pickled, mapped to inert
stand-ins (:class:`UpstreamObject`, :class:`UpstreamStorage`, :class:`PeerObject`). Any other
global raises :class:`~emote_core.errors.UnsafePickleError` before anything runs; only
``trust=True`` uses plain :mod:`pickle`.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import io
import pickle
import struct
from typing import IO, Any, ClassVar

import numpy as np
from numpy.lib import format as npy_format

from emote_core.errors import FormatError, UnsafePickleError
from emote_core.stores.budget import AllocationBudget

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _numeric  # type: ignore[no-redef]

UPSTREAM_OBJECTS: tuple[tuple[str, str], ...] = (
    ("emote.memory.fifo_strategy", "FifoEjectionStrategy"),
    ("emote.memory.fifo_strategy", "FifoSampleStrategy"),
    ("emote.memory.uniform_strategy", "UniformSampleStrategy"),
    ("emote.memory.uniform_strategy", "UniformEjectionStrategy"),
    ("emote.memory.coverage_based_strategy", "CoverageBasedSampleStrategy"),
    ("emote.memory.column", "Column"),
    ("emote.memory.column", "TagColumn"),
    ("emote.memory.column", "VirtualColumn"),
    ("emote.memory.storage", "VirtualStorage"),
    ("emote.memory.storage", "NextElementMapper"),
    ("emote.memory.storage", "NextElementMapper.with_only_last"),
    ("emote.memory.storage", "SyntheticDones"),
    ("emote.memory.storage", "SyntheticDones.as_mask"),
)
"""Upstream emote globals (module, qualified name) that Legacy pickles name; each resolves to an
:class:`UpstreamObject` stand-in class."""

UPSTREAM_STORAGES: tuple[tuple[str, str], ...] = (
    ("emote.memory.storage", "BaseStorage"),
    ("emote.memory.storage", "TagStorage"),
)
"""Upstream dict subclasses (episode id -> array); each resolves to an :class:`UpstreamStorage`."""

_GYM_SPACES = (
    ("box", "Box"), ("discrete", "Discrete"), ("dict", "Dict"),
    ("multi_discrete", "MultiDiscrete"), ("multi_binary", "MultiBinary"),
)  # fmt: skip
PEER_OBJECTS: tuple[tuple[str, str], ...] = (
    ("stable_baselines3.common.buffers", "ReplayBuffer"),
    ("stable_baselines3.common.buffers", "DictReplayBuffer"),
    ("stable_baselines3.common.buffers", "NStepReplayBuffer"),
    *((f"{package}.spaces.{module}", name) for package in ("gymnasium", "gym")
      for module, name in _GYM_SPACES),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("torch", "device"),
)  # fmt: skip
"""Globals that peers' replay files name (Stable-Baselines3 ``save_replay_buffer`` pickles: the
buffer, its gymnasium (or old gym) spaces, the numpy generators the spaces hold, the buffer's
``torch.device``); each resolves to a :class:`PeerObject` stand-in class."""


class _StandIn:
    """What both stand-in kinds share: attributes and items are stored, nothing is called."""

    upstream_name: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["constructor_args"] = args  # a REDUCE of the class passes arguments

    def __setstate__(self, state: Any) -> None:
        if not isinstance(self, _StandIn):  # a BUILD aimed at the stand-in class itself
            raise UnsafePickleError("a pickle tries to set state on a stand-in class; refused")
        attributes = state
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__ state, __slots__ state)
            attributes = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(attributes, dict):
            raise UnsafePickleError(
                f"a pickled {self.upstream_name} has state of type {type(state).__name__}; "
                "only a dict of attributes is accepted"
            )
        for key in attributes:
            if not isinstance(key, str) or key.startswith("__"):
                raise UnsafePickleError(
                    f"a pickled {self.upstream_name} sets attribute {key!r}; only plain "
                    "attribute names are accepted"
                )
        self.__dict__.update(attributes)

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{type(self).__name__} is a read-only stand-in for {self.upstream_name}; it cannot "
            "be pickled"
        )

    def __repr__(self) -> str:
        return f"<stand-in for {self.upstream_name}: {sorted(self.__dict__)}>"


class UpstreamObject(_StandIn):
    """An inert stand-in for an upstream emote object (a strategy, a column, a mapper).

    Its attributes are exactly those pickled; the class attribute ``upstream_name`` says which
    upstream global it replaces. A reference to an upstream class or function (such as
    ``mapper=SyntheticDones.as_mask``) resolves to the stand-in class itself.
    """


class UpstreamStorage(_StandIn, dict):  # type: ignore[misc]
    """An inert stand-in for upstream emote's dict-based storages: episode id -> array.

    Pickle fills it through ``SETITEMS`` like a plain dict; its attributes (``_shape``,
    ``_dtype``, ...) are kept as pickled.
    """

    __hash__ = None  # type: ignore[assignment]


class PeerObject(_StandIn):
    """An inert stand-in for an object in a peer's pickle (a replay buffer, a space, a generator).

    Calling the stand-in class (a pickled constructor call such as ``torch.device('cpu')`` or
    numpy's ``__generator_ctor(...)``) only records the arguments in ``constructor_args``. State
    that is a dict of attributes is set as attributes; any other pickled state (numpy's bit
    generators pickle tuples) is kept unchanged in ``pickled_state``.
    """

    def __setstate__(self, state: Any) -> None:
        if not isinstance(self, _StandIn):  # a BUILD aimed at the stand-in class itself
            raise UnsafePickleError("a pickle tries to set state on a stand-in class; refused")
        slots_form = (
            isinstance(state, tuple)
            and len(state) == 2
            and all(part is None or isinstance(part, dict) for part in state)
        )
        if isinstance(state, dict) or slots_form:
            super().__setstate__(state)
        else:
            self.__dict__["pickled_state"] = state


def _make_stand_in(module: str, qualname: str, base: type) -> type:
    short = qualname.replace(".", "_")
    return type(f"StandIn_{short}", (base,), {"upstream_name": f"{module}.{qualname}"})


def upstream_name(value: Any) -> str | None:
    """The upstream global a stand-in instance or class replaces; ``None`` for other values."""
    if isinstance(value, type) and issubclass(value, _StandIn):
        return value.upstream_name
    if isinstance(value, _StandIn):
        return value.upstream_name
    return None


class _Latin1Encode:
    """``_codecs.encode`` as pickles of bytes use it (protocol 2): latin1 only.

    An instance with no ``__dict__``, so a pickle cannot set attributes on this shared object.
    """

    __slots__ = ()

    def __call__(self, text: Any, encoding: Any = "utf-8") -> bytes:
        if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
            raise UnsafePickleError(
                f"a pickle calls _codecs.encode with encoding {encoding!r}; only 'latin1' is "
                "allowed"
            )
        return text.encode("latin1")

    def __setstate__(self, state: Any) -> None:
        raise UnsafePickleError("a pickle tries to set state on _codecs.encode; refused")


# fmt: off
_NUMPY_SCALARS = (
    "bool_", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "intc", "uintc", "int_", "uint", "intp", "uintp", "longlong", "ulonglong", "byte", "ubyte",
    "short", "ushort", "float16", "float32", "float64", "half", "single", "double", "longdouble",
    "complex64", "complex128", "csingle", "cdouble", "clongdouble", "str_", "bytes_",
)
_BUILTINS = ("set", "frozenset", "bytearray", "complex", "slice", "bool", "int", "float")
# fmt: on
_NUMPY_1_ALIASES = {
    "bool8": np.bool_,
    "float_": np.float64,
    "complex_": np.complex128,
    "unicode_": np.str_,
    "string_": np.bytes_,
    "int0": np.intp,
    "uint0": np.uintp,
    "longfloat": np.longdouble,
}


def _build_allowlist() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {}
    for name in _NUMPY_SCALARS:
        if hasattr(np, name):
            allowed["numpy", name] = getattr(np, name)
    for name, value in _NUMPY_1_ALIASES.items():
        allowed["numpy", name] = value
    allowed["numpy", "ndarray"] = np.ndarray
    allowed["numpy", "dtype"] = np.dtype
    for package in ("numpy.core", "numpy._core"):  # numpy 1.x and 2.x spellings
        allowed[f"{package}.multiarray", "_reconstruct"] = _multiarray._reconstruct
        allowed[f"{package}.multiarray", "scalar"] = _multiarray.scalar
        allowed[f"{package}.numeric", "_frombuffer"] = _numeric._frombuffer
    for name in _BUILTINS:
        allowed["builtins", name] = getattr(builtins, name)
    allowed["collections", "deque"] = collections.deque
    allowed["collections", "OrderedDict"] = collections.OrderedDict
    allowed["_codecs", "encode"] = _Latin1Encode()
    for module, qualname in UPSTREAM_OBJECTS:
        allowed[module, qualname] = _make_stand_in(module, qualname, UpstreamObject)
    for module, qualname in UPSTREAM_STORAGES:
        allowed[module, qualname] = _make_stand_in(module, qualname, UpstreamStorage)
    for module, qualname in PEER_OBJECTS:
        allowed[module, qualname] = _make_stand_in(module, qualname, PeerObject)
    return allowed


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = _build_allowlist()
"""Every ``(module, name)`` a restricted pickle may name, and what it resolves to."""


class _Stopped(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


def _sized_arguments(value: Any) -> bool:
    return isinstance(value, list | tuple | np.ndarray)


class RestrictedUnpickler(pickle._Unpickler):  # the Python unpickler: see the class doc
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS`, refuses everything else, and
    charges an :class:`~emote_core.stores.budget.AllocationBudget` before allocating.

    It is the pure-Python unpickler, because the C one allocates what a pickle declares before
    reading it (a 10-byte pickle can ask for gigabytes of memo or bytes). The allowlisted calls
    that allocate by a declared size (``bytearray(n)``, ``numpy.ndarray(shape)``, numpy's
    ``_reconstruct`` and array state, numpy scalar types given nested lists) are charged first.

    Args:
        file: The pickle, a binary file positioned at its start.
        budget: What it may allocate; by default the budget of a file of the stream's size.

    Raises (from :meth:`load`):
        UnsafePickleError: The pickle names a global outside the allowlist, or uses persistent
            ids; nothing it names was imported or called.
        FormatError: The pickle declares more than its budget allows; nothing was allocated.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: IO[bytes], *, budget: AllocationBudget | None = None, **kwargs: Any):
        super().__init__(file, **kwargs)
        self.stream = file
        position = file.tell()
        self.size = file.seek(0, io.SEEK_END) - position
        file.seek(position)
        self.budget = budget or AllocationBudget("the pickle", self.size)

    def load(self) -> Any:
        """Reads the pickle; see the class doc for what it refuses."""
        # Frames (protocol 4+) only group the opcodes that follow them in the stream, so every
        # read goes straight to the stream, without pickle's pure-Python framing layer.
        self.read, self.readinto = self.stream.read, self.stream.readinto  # type: ignore[attr-defined]
        self.readline = self.stream.readline
        self.metastack, self.stack = [], []
        self.append = self.stack.append
        self.proto = 0
        read, dispatch = self.read, self.dispatch
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError("the pickle ends before its STOP opcode")
                dispatch[key[0]](self)
        except _Stopped as stopped:
            return stopped.value

    def load_frame(self) -> None:
        self.read(8)  # the frame's length: its opcodes follow and are read as they come

    dispatch[pickle.FRAME[0]] = load_frame

    def load_stop(self) -> None:
        raise _Stopped(self.stack.pop())

    dispatch[pickle.STOP[0]] = load_stop

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 era names (protocols 0-2: "__builtin__.long") map as plain pickle maps them.
        key = _compat_pickle.NAME_MAPPING.get((module, name))
        if key is None:
            key = (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
        found = ALLOWED_GLOBALS.get(key)
        if found is None:
            raise UnsafePickleError(
                f"pickle names the global '{module}.{name}', which is outside emote's allowlist "
                "of data types; it was refused without running anything. If you trust where the "
                "file comes from, load it with `trust=True`"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            f"pickle refers to persistent id {pid!r}; emote does not resolve persistent ids"
        )

    def _charge_call(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Charges what calling an allowlisted ``func`` allocates by the sizes it is given."""
        budget = self.budget
        if func is bytearray and args:
            if isinstance(args[0], int):
                budget.charge("a pickled bytearray", args[0], f"bytearray({args[0]})")
            elif _sized_arguments(args[0]):
                budget.charge_nested("a pickled bytearray", args[0])
        elif func is np.ndarray:
            names = ("shape", "dtype", "buffer")
            given = {**dict(zip(names, args, strict=False)), **kwargs}
            if given.get("buffer") is None:
                shape, dtype = given.get("shape", ()), given.get("dtype", float)
                budget.charge_array("a pickled numpy.ndarray call", shape, dtype)
        elif func is _multiarray._reconstruct and len(args) >= 3:
            budget.charge_array("a pickled numpy array", args[1], args[2])
        elif isinstance(func, type) and issubclass(func, np.generic):
            for value in (*args, *kwargs.values()):
                if _sized_arguments(value):
                    budget.charge_nested(f"a pickled numpy.{func.__name__} call", value)

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        self._charge_call(func, args, {})
        stack[-1] = func(*args)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self._charge_call(cls, args, {})
        self.append(cls.__new__(cls, *args))

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._charge_call(cls, args, kwargs)
        self.append(cls.__new__(cls, *args, **kwargs))

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _instantiate(self, klass: Any, args: tuple) -> None:  # INST and OBJ (protocols 0-1)
        self._charge_call(klass, args, {})
        super()._instantiate(klass, args)

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if isinstance(inst, np.ndarray) and isinstance(state, tuple) and len(state) in (4, 5):
            shape, dtype = state[-4], state[-3]  # ([version,] shape, dtype, fortran, data)
            self.budget.charge_array("a pickled numpy array", shape, dtype)
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def load_bytearray8(self) -> None:
        (length,) = struct.unpack("<Q", self.read(8))
        if length > self.size:
            raise FormatError(
                f"{self.budget.source}: the data is not a readable pickle (a bytearray "
                f"declares {length:,} bytes, the whole pickle holds {self.size:,}); the file is "
                "truncated or damaged"
            )
        buffer = bytearray(length)
        self.readinto(buffer)
        self.append(buffer)

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8


def safe_loads(data: bytes, *, trust: bool = False, budget: AllocationBudget | None = None) -> Any:
    """Unpickles ``data`` through :class:`RestrictedUnpickler`.

    Args:
        data: The pickle's bytes.
        trust: Use plain :func:`pickle.loads`, which runs whatever the pickle names. Only for
            files whose origin the user vouches for; callers log a warning.
        budget: What unpickling may allocate (the file's budget, when the pickle is part of
            one); by default that of a file of ``len(data)`` bytes.

    Returns:
        The unpickled value; upstream emote objects come back as stand-ins.

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist.
        FormatError: The data is not a readable pickle (truncated, corrupt), or declares more
            than its budget allows.
    """
    try:
        # latin1 reads Python 2 pickles' byte strings (numpy array buffers) back as numpy expects.
        if trust:
            return pickle.loads(data, encoding="latin1")  # the caller vouched for this file
        return RestrictedUnpickler(io.BytesIO(data), budget=budget, encoding="latin1").load()
    except FormatError:  # refused globals and budgets, already one line
        raise
    except Exception as error:  # pickle reports damage with many exception types
        where = f"{budget.source}: " if budget is not None else ""
        raise FormatError(
            f"{where}the data is not a readable pickle ({type(error).__name__}: {error}); the "
            "file is damaged or not in the format it claims"
        ) from error


def safe_load(
    file: IO[bytes], *, trust: bool = False, budget: AllocationBudget | None = None
) -> Any:
    """Unpickles the rest of a binary ``file``; see :func:`safe_loads`."""
    return safe_loads(file.read(), trust=trust, budget=budget)


def read_npy(
    data: bytes,
    *,
    objects: bool = True,
    trust: bool = False,
    budget: AllocationBudget | None = None,
) -> np.ndarray:
    """Reads a ``.npy`` file's bytes without letting numpy unpickle anything.

    Plain arrays are read from their raw bytes (a read-only view of ``data``). Object arrays
    (whose payload is a pickle) are unpickled through :func:`safe_loads`, never through
    ``np.load(allow_pickle=True)``.

    Args:
        data: The whole ``.npy`` file.
        objects: Whether object arrays are expected at all; if not, one is an error and its
            pickle is never read.
        trust: Passed on to :func:`safe_loads` for object arrays.
        budget: Passed on to :func:`safe_loads` for object arrays (plain arrays are views).

    Raises:
        FormatError: The bytes are not a ``.npy`` file, are truncated, or hold an object array
            where ``objects`` is false.
        UnsafePickleError: An object array's pickle names a global outside the allowlist.
    """
    stream = io.BytesIO(data)
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):  # 3.0 differs from 2.0 only in the header's encoding
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise FormatError(f".npy version {version} is not supported; expected 1.0 to 3.0")
    except FormatError:
        raise
    except Exception as error:  # numpy raises ValueError/EOFError/SyntaxError for bad headers
        raise FormatError(f"not a readable .npy array ({error})") from error
    offset = stream.tell()
    if dtype.hasobject:
        if not objects:
            raise FormatError(
                f"the .npy array has dtype {dtype}: it holds pickled objects where plain data "
                "is expected; it was not unpickled"
            )
        array = safe_loads(data[offset:], trust=trust, budget=budget)
        if not isinstance(array, np.ndarray) or array.shape != shape:
            raise FormatError(
                f"a .npy object array's pickle holds {type(array).__name__}, not the array of "
                f"shape {shape} its header announces"
            )
        return array
    count = int(np.prod(shape, dtype=np.int64))
    needed = count * dtype.itemsize
    if len(data) - offset < needed:
        raise FormatError(
            f".npy array of shape {shape} and dtype {dtype} needs {needed} bytes of data; the "
            f"file holds {len(data) - offset} (truncated)"
        )
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran_order else "C")


__all__ = [
    "ALLOWED_GLOBALS",
    "PEER_OBJECTS",
    "UPSTREAM_OBJECTS",
    "UPSTREAM_STORAGES",
    "PeerObject",
    "RestrictedUnpickler",
    "UpstreamObject",
    "UpstreamStorage",
    "read_npy",
    "safe_load",
    "safe_loads",
    "upstream_name",
]
