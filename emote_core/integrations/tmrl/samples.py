"""tmrl's sample tuples in and out of an episode table: layouts, tmrl's CRC check, collation.

tmrl's rollout workers send samples ``(act, new_obs, rew, terminated, truncated, info)``: the
action that led to ``new_obs`` and its reward. Observations are arrays or tuples of arrays (speed,
lidar, images...); a table stores fixed-shape arrays, so each part of a tuple observation is a
column of its own (``obs_0``, ``obs_1``, ...; a plain array observation is ``obs``) and the tuple
is rebuilt when a transition is read. This module knows those layouts, the check tmrl's
``crc_debug`` mode makes, and how tmrl collates samples into batched tensors.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from emote_core.errors import MemoryTableError, SchemaError

log = logging.getLogger(__name__)

OBS_KEY = "obs"
"""The observation column of array observations; tuple parts are ``obs_0``, ``obs_1``, ..."""

CRC_SAMPLE_KEY = "crc_sample"
"""The info key where a tmrl worker with ``crc_debug`` puts what it sent."""

CRC_TIME_KEY = "crc_sample_ts"
"""The info key of the worker's step counters (since start, since reset) for that sample."""


class CrcMismatchError(MemoryTableError):
    """A transition read back from the memory differs from what the tmrl worker sent."""


@dataclass(frozen=True)
class ArrayLayout:
    """How one value (an action, an observation part) is stored: its shape and dtype.

    Scalars are stored with shape ``(1,)`` and given back as scalars of their dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @classmethod
    def of(cls, value: Any, what: str) -> ArrayLayout:
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise SchemaError(
                f"{what} has dtype {array.dtype} ({value!r:.60}); the memory stores numbers "
                "only — send numeric arrays from the worker"
            )
        return cls(tuple(array.shape), array.dtype)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return self.shape or (1,)

    def to_rows(self, values: Sequence[Any], what: str) -> np.ndarray:
        """Stacks ``values`` into ``(len(values), *stored_shape)`` rows of this dtype."""
        try:
            array = np.asarray([np.asarray(v) for v in values])
        except ValueError as error:
            raise SchemaError(f"{what} differ in shape ({error})") from error
        if array.shape[1:] != self.shape:
            raise SchemaError(
                f"{what} have shape {array.shape[1:]}; the memory was laid out for {self.shape} "
                "by the first sample — send values of one shape"
            )
        return array.astype(self.dtype, copy=False).reshape(len(values), *self.stored_shape)

    def value(self, row: np.ndarray) -> Any:
        """One stored row given back in the value's own shape (a numpy scalar for scalars)."""
        return row.reshape(self.shape)[()] if not self.shape else row.reshape(self.shape)


@dataclass(frozen=True)
class ObservationLayout:
    """The columns of an observation: one (``obs``) for an array, one per part for a tuple."""

    parts: tuple[ArrayLayout, ...]
    is_tuple: bool

    @classmethod
    def of(cls, observation: Any) -> ObservationLayout:
        if isinstance(observation, tuple | list):
            if not observation:
                raise SchemaError("observations are empty tuples; the memory needs values")
            parts = tuple(
                ArrayLayout.of(p, f"observation part {i}") for i, p in enumerate(observation)
            )
            return cls(parts, True)
        return cls((ArrayLayout.of(observation, "the observation"),), False)

    @property
    def keys(self) -> list[str]:
        if not self.is_tuple:
            return [OBS_KEY]
        return [f"{OBS_KEY}_{i}" for i in range(len(self.parts))]

    def columns(self, observations: Sequence[Any]) -> dict[str, np.ndarray]:
        """Observations as one array per column (rows in order)."""
        if not self.is_tuple:
            return {OBS_KEY: self.parts[0].to_rows(observations, "observations")}
        for observation in observations:
            if not isinstance(observation, tuple | list) or len(observation) != len(self.parts):
                raise SchemaError(
                    f"an observation is {type(observation).__name__} of "
                    f"{len(observation) if isinstance(observation, tuple | list) else 1} parts; "
                    f"the memory was laid out for tuples of {len(self.parts)} parts"
                )
        return {
            key: part.to_rows([o[i] for o in observations], f"observation part {i}")
            for i, (key, part) in enumerate(zip(self.keys, self.parts, strict=True))
        }

    def value(self, rows: Mapping[str, np.ndarray], index: int) -> Any:
        """Observation ``index`` of ``rows`` (one array per column), as the worker sent it."""
        values = [p.value(rows[k][index]) for k, p in zip(self.keys, self.parts, strict=True)]
        return tuple(values) if self.is_tuple else values[0]


def _same(original: Any, rebuilt: Any) -> bool:
    """Whether a value came back intact: same structure, shape and values (in the stored dtype)."""
    if isinstance(original, tuple | list) or isinstance(rebuilt, tuple | list):
        if not (isinstance(original, tuple | list) and isinstance(rebuilt, tuple | list)):
            return False
        return len(original) == len(rebuilt) and all(
            _same(o, r) for o, r in zip(original, rebuilt, strict=True)
        )
    sent, got = np.asarray(original), np.asarray(rebuilt)
    if sent.shape != got.shape:
        return False
    try:
        cast = sent.astype(got.dtype)
    except (TypeError, ValueError):
        return False
    return bool(np.array_equal(cast, got, equal_nan=got.dtype.kind == "f"))


def _crc(value: Any) -> int:
    if isinstance(value, tuple | list):
        crc = 0
        for part in value:
            crc = zlib.crc32(np.int64(_crc(part)).tobytes(), crc)
        return crc
    array = np.ascontiguousarray(np.asarray(value))
    return zlib.crc32(array.tobytes(), zlib.crc32(array.dtype.str.encode()))


_CRC_FIELDS = ("previous observation", "action", "observation", "reward", "terminated", "truncated")


def check_crc_sample(transition: Sequence[Any], info: Mapping[str, Any]) -> None:
    """tmrl's ``crc_debug`` check: the transition read back equals what the worker sent.

    A tmrl worker run with ``crc_debug=True`` puts ``(prev_obs, act, new_obs, rew, terminated,
    truncated)`` in each sample's ``info["crc_sample"]`` and its step counters in
    ``info["crc_sample_ts"]``. Every field read back must equal the one sent (after conversion to
    the stored dtype); a ``None`` previous observation (a reset) is not compared, as in tmrl.

    Args:
        transition: ``(prev_obs, new_act, rew, new_obs, terminated, truncated)`` as read back.
        info: The info the worker sent with the sample.

    Raises:
        CrcMismatchError: If the info holds no ``crc_sample`` or a field differs, naming the
            field, both values and the worker's step counters.
    """
    if CRC_SAMPLE_KEY not in info:
        raise CrcMismatchError(
            f"crc_debug is on but the sample's info holds no '{CRC_SAMPLE_KEY}' (keys: "
            f"{sorted(info)}); run the rollout worker with crc_debug=True too, or turn it off"
        )
    po, a, o, r, d, t = info[CRC_SAMPLE_KEY]
    step, since_reset = info.get(CRC_TIME_KEY, (None, None))
    prev_obs, new_act, rew, new_obs, terminated, truncated = transition
    pairs = ((po, prev_obs), (a, new_act), (o, new_obs), (r, rew), (d, terminated), (t, truncated))
    for name, (sent, got) in zip(_CRC_FIELDS, pairs, strict=True):
        if name == "previous observation" and sent is None:
            continue
        if not _same(sent, got):
            raise CrcMismatchError(
                f"crc_debug: the {name} read back differs from what the worker sent at time step "
                f"{step} ({since_reset} since reset): sent {sent!r} (crc {_crc(sent):#010x}), "
                f"read {got!r} (crc {_crc(got):#010x}); the pipeline between the worker and the "
                "memory changes samples (a local buffer compressor, an obs preprocessor or a dtype)"
            )
    log.debug("crc_debug: transition intact (time step %s, %s since reset)", step, since_reset)


def collate_samples(batch: Sequence[Any], device: str | torch.device | None = None) -> Any:
    """Collates a list of samples into the same nested structure of batched tensors.

    Arrays are stacked along a new first dimension; tuples and lists are collated part by part,
    mappings key by key; numbers become a 1-D tensor. This is what tmrl's ``TorchMemory.collate``
    does, so a tmrl training agent gets the tensors it expects.
    """
    first = batch[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(batch)).to(device)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.stack(batch)).to(device)
    if isinstance(first, Mapping):
        return type(first)((key, collate_samples([s[key] for s in batch], device)) for key in first)
    if isinstance(first, tuple | list):
        return type(first)(collate_samples(list(part), device) for part in zip(*batch, strict=True))
    return torch.from_numpy(np.asarray(batch)).to(device)


__all__ = [
    "CRC_SAMPLE_KEY",
    "CRC_TIME_KEY",
    "OBS_KEY",
    "ArrayLayout",
    "CrcMismatchError",
    "ObservationLayout",
    "check_crc_sample",
    "collate_samples",
]
