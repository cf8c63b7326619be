"""Adaptors: transformations applied, in order, to every batch a memory table samples.

An adaptor is any callable ``adaptor(batch, count, sequence_length) -> batch``
(:class:`Adaptor`) using only torch operations on the batch's tensors, so a GPU batch stays on
the GPU. The tables of :mod:`emote_core.memory.builders` apply :class:`TerminalAdaptor`, the
user's adaptors (on flat column names), :class:`DictObsAdaptor` and the user's preprocessor
(a :class:`SamplePreprocessor`, say), in this order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.memory.storage import torch_dtype

OBSERVATION_KEY = "observation"
"""The batch entry holding the observation dict of each sampled transition."""

NEXT_OBSERVATION_KEY = "next_observation"
"""The batch entry holding the observation dict after each transition (or after each window)."""


@runtime_checkable
class Adaptor(Protocol):
    """Transforms a sampled batch: ``adaptor(batch, count, sequence_length) -> batch``.

    Any function or callable object with this signature is an adaptor; it may change ``batch`` in
    place and must return the batch to pass on.
    """

    def __call__(
        self, batch: dict[str, Any], count: int, sequence_length: int, /
    ) -> dict[str, Any]: ...


def _require(adaptor: object, batch: dict[str, Any], key: str) -> Any:
    if key not in batch:
        raise ConfigurationError(
            f"{type(adaptor).__name__} reads batch key '{key}', which the sampled batch does not "
            f"hold; batch keys: {sorted(batch)} — check the key name and the adaptors' order"
        )
    return batch[key]


class DictObsAdaptor:
    """Gathers flat observation columns into the ``observation`` / ``next_observation`` dicts.

    For each observation key, the stored column ``key`` moves to ``batch["observation"][out]``
    and its virtual next column ``next_prefix + key`` to ``batch["next_observation"][out]``; the
    flat entries are removed. If the batch holds no next column for any of the keys,
    ``next_observation`` is left out.

    Args:
        observation_keys: The flat column names of the observation entries.
        output_keys: The names inside the dicts, one per observation key; defaults to the same.
        next_prefix: The prefix of the virtual next-observation columns.
        with_next: Whether next observations are gathered too (upstream emote's argument):
            ``True`` requires every next column, ``False`` leaves them as flat entries and adds
            no ``next_observation`` (upstream added an empty dict), ``None`` (the default)
            gathers them when the batch has them.

    Raises:
        ConfigurationError: If keys repeat, or ``output_keys`` does not match in length.
    """

    def __init__(
        self,
        observation_keys: Sequence[str],
        *,
        output_keys: Sequence[str] | None = None,
        next_prefix: str = "next_",
        with_next: bool | None = None,
    ) -> None:
        keys = list(observation_keys)
        if with_next not in (True, False, None):
            raise ConfigurationError(
                f"DictObsAdaptor's with_next must be true, false or None (gather next "
                f"observations when present); got {with_next!r}"
            )
        self.with_next = with_next
        outputs = keys if output_keys is None else list(output_keys)
        if not keys:
            raise ConfigurationError("DictObsAdaptor needs at least one observation key")
        if len(outputs) != len(keys):
            raise ConfigurationError(
                f"DictObsAdaptor got {len(keys)} observation keys {keys} but {len(outputs)} "
                f"output keys {outputs}; give one output key per observation key"
            )
        for name, values in (("observation", keys), ("output", outputs)):
            repeated = sorted({k for k in values if values.count(k) > 1})
            if repeated:
                raise ConfigurationError(f"DictObsAdaptor's {name} keys repeat: {repeated}")
        self.key_map = list(zip(keys, outputs, strict=True))
        self.next_prefix = next_prefix

    def __call__(self, batch: dict[str, Any], count: int, sequence_length: int) -> dict[str, Any]:
        observation = {out: _require(self, batch, key) for key, out in self.key_map}
        next_names = [(self.next_prefix + key, out) for key, out in self.key_map]
        present = [] if self.with_next is False else [n for n, _ in next_names if n in batch]
        if (present or self.with_next) and len(present) != len(next_names):
            missing = sorted(name for name, _ in next_names if name not in batch)
            rule = (
                "with_next=True needs every observation key's next column; build the table "
                "with next-observation columns or pass with_next=False"
                if self.with_next
                else "every observation key needs its next column, or none does"
            )
            raise ConfigurationError(
                f"DictObsAdaptor found next-observation columns {present} but not {missing}; "
                + rule
            )
        for key, _ in self.key_map:
            del batch[key]
        batch[OBSERVATION_KEY] = observation
        if present:
            batch[NEXT_OBSERVATION_KEY] = {out: batch.pop(name) for name, out in next_names}
        return batch

    def __repr__(self) -> str:
        return (
            f"DictObsAdaptor(key_map={self.key_map!r}, next_prefix={self.next_prefix!r}, "
            f"with_next={self.with_next!r})"
        )


class KeyScaleAdaptor:
    """Multiplies one batch entry by a constant, for example to scale rewards.

    Args:
        scale: A number, or values broadcastable to the entry's per-row shape.
        key: The batch entry to scale.
    """

    def __init__(
        self, scale: float | Sequence[float] | np.ndarray | torch.Tensor, key: str
    ) -> None:
        self.scale = torch.as_tensor(scale).detach().clone()
        if not (self.scale.is_floating_point() or self.scale.dtype == torch.int64):
            self.scale = self.scale.to(torch.float32)
        self.key = key
        self._cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def _scale_for(self, tensor: torch.Tensor) -> torch.Tensor:
        # Matching the entry's device and floating dtype keeps the product on the device and of
        # the entry's precision; the converted scale is made once per device and dtype.
        dtype = tensor.dtype if tensor.is_floating_point() else self.scale.dtype
        cache_key = (tensor.device, dtype)
        if cache_key not in self._cache:
            self._cache[cache_key] = self.scale.to(device=tensor.device, dtype=dtype)
        return self._cache[cache_key]

    def __call__(self, batch: dict[str, Any], count: int, sequence_length: int) -> dict[str, Any]:
        tensor = _require(self, batch, self.key)
        batch[self.key] = tensor * self._scale_for(tensor)
        return batch

    def __repr__(self) -> str:
        return f"KeyScaleAdaptor(scale={self.scale.tolist()!r}, key={self.key!r})"


class KeyCastAdaptor:
    """Casts one batch entry to another dtype (for example ``uint8`` images to ``float32``).

    Args:
        dtype: A torch dtype, or anything numpy reads as a dtype (``np.float32``, ``"float16"``).
        key: The batch entry to cast.

    Raises:
        ConfigurationError: If ``dtype`` is not a dtype torch can hold.
    """

    def __init__(self, dtype: torch.dtype | np.dtype[Any] | type | str, key: str) -> None:
        if isinstance(dtype, torch.dtype):
            self.dtype = dtype
        else:
            try:
                self.dtype = torch_dtype(np.dtype(dtype))
            except TypeError as error:
                raise ConfigurationError(
                    f"KeyCastAdaptor for '{key}' got dtype {dtype!r}, which torch cannot hold; "
                    "pass a torch dtype or a numeric numpy dtype"
                ) from error
        self.key = key

    def __call__(self, batch: dict[str, Any], count: int, sequence_length: int) -> dict[str, Any]:
        batch[self.key] = _require(self, batch, self.key).to(self.dtype)
        return batch

    def __repr__(self) -> str:
        return f"KeyCastAdaptor(dtype={self.dtype}, key={self.key!r})"


class TerminalAdaptor:
    """Recomputes masks from a terminal flag recorded with every observation.

    For upstream emote's ``use_terminal`` tables, whose flag column holds, per observation
    (``N + 1`` rows), whether the task ended there. For every sampled transition::

        masks = 0  if dones == 1 and flag != 0   (flag of the observation it leads to)
        masks = 1  otherwise

    so the final observation's flag overrides the episode's end state. The flag may also be one
    value per window (a tag column: whether the episode ended terminal). The mask keeps the target
    entry's dtype and shape; the flag entries are removed from the batch. Arguments are
    keyword-only because upstream's ``TerminalAdaptor(target_key, value_key)`` takes them in the
    other order (``docs/porting.md``).

    Args:
        value_key: The batch entry holding, per sampled transition, the flag of the observation
            the transition leads to, or one flag per window.
        target_key: The mask entry to overwrite.
        dones_key: The entry that is 1 at an episode's last transition.
        drop_keys: Further flag entries to remove from the batch once used (the flag at the
            transition's own observation, ``"terminal"`` in the builders' tables).
    """

    def __init__(
        self,
        *,
        value_key: str = "next_terminal",
        target_key: str = "masks",
        dones_key: str = "dones",
        drop_keys: Sequence[str] = ("terminal",),
    ) -> None:
        self.value_key = value_key
        self.target_key = target_key
        self.dones_key = dones_key
        self.drop_keys = tuple(drop_keys)

    def __call__(self, batch: dict[str, Any], count: int, sequence_length: int) -> dict[str, Any]:
        target = _require(self, batch, self.target_key)
        flag = _require(self, batch, self.value_key)
        dones = _require(self, batch, self.dones_key)
        if flag.shape[0] == count and target.shape[0] == count * sequence_length:
            # one flag per window (a tag column): it holds for every step of the window
            flag = flag.repeat_interleave(sequence_length, dim=0)
        if flag.shape[0] != target.shape[0] or dones.shape[0] != target.shape[0]:
            raise ConfigurationError(
                f"TerminalAdaptor needs one '{self.value_key}' and one '{self.dones_key}' row per "
                f"'{self.target_key}' row; got {flag.shape[0]}, {dones.shape[0]} and "
                f"{target.shape[0]} rows — the flag must be a per-step or a tag column"
            )
        ended = (dones.reshape(target.shape) != 0) & (flag.reshape(target.shape) != 0)
        batch[self.target_key] = (~ended).to(target.dtype)
        del batch[self.value_key]
        for key in self.drop_keys:
            batch.pop(key, None)
        return batch

    def __repr__(self) -> str:
        return (
            f"TerminalAdaptor(value_key={self.value_key!r}, target_key={self.target_key!r}, "
            f"dones_key={self.dones_key!r})"
        )


Transform = Callable[[torch.Tensor], torch.Tensor]
"""A function from a batch of one observation entry to the transformed batch (same rows)."""


class SamplePreprocessor:
    """Runs a user transform, such as an augmentation, over observation entries of each batch.

    Meant to run last, on the nested batch layout: for every group in ``groups`` present in the
    batch (by default ``observation`` and ``next_observation``), the transform replaces each
    chosen entry. It is called separately per group, so a random transform draws independently
    for observations and next observations.

    Args:
        transform: A function from a tensor of rows to a tensor of as many rows.
        keys: The observation keys to transform; ``None`` transforms every key of the group.
        groups: The batch entries holding observation dicts.
    """

    def __init__(
        self,
        transform: Transform,
        *,
        keys: Sequence[str] | None = None,
        groups: Sequence[str] = (OBSERVATION_KEY, NEXT_OBSERVATION_KEY),
    ) -> None:
        if not callable(transform):
            raise ConfigurationError(
                f"SamplePreprocessor needs a callable transform; got {transform!r}"
            )
        self.transform = transform
        self.keys = None if keys is None else list(keys)
        self.groups = list(groups)

    def __call__(self, batch: dict[str, Any], count: int, sequence_length: int) -> dict[str, Any]:
        for group in self.groups:
            values = batch.get(group)
            if values is None:
                continue
            for key in self.keys if self.keys is not None else list(values):
                tensor = _require(self, values, key)
                transformed = self.transform(tensor)
                if transformed.shape[0] != tensor.shape[0]:
                    raise ConfigurationError(
                        f"the transform of SamplePreprocessor turned {tensor.shape[0]} rows of "
                        f"'{group}/{key}' into {transformed.shape[0]}; it must keep one row per "
                        "sampled step"
                    )
                values[key] = transformed
        return batch

    def __repr__(self) -> str:
        return f"SamplePreprocessor({self.transform!r}, keys={self.keys!r}, groups={self.groups!r})"


class RandomShift:
    """Shifts each image in a batch by a random number of pixels, edges repeated (DrQ-style).

    Each image moves independently by up to ``pad`` pixels along each of its last two
    dimensions; pixels shifted in from outside copy the nearest edge pixel. Works on any dtype
    and device; the randomness comes from a generator per device seeded from ``seed``.

    Args:
        pad: The largest shift in pixels.
        seed: Seed of the shifts, for reproducible runs; ``None`` draws a fresh seed.

    Raises:
        ConfigurationError: If ``pad`` is negative.
    """

    def __init__(self, pad: int = 4, *, seed: int | None = None) -> None:
        if pad < 0:
            raise ConfigurationError(f"RandomShift needs pad >= 0 pixels; got {pad}")
        self.pad = pad
        self.seed = int(np.random.SeedSequence(seed).generate_state(1)[0])
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.seed)
            self._generators[device] = generator
        return self._generators[device]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Shifts ``images`` of shape ``(batch, ..., height, width)``."""
        if images.ndim < 3:
            raise ConfigurationError(
                f"RandomShift needs images shaped (batch, ..., height, width); got shape "
                f"{tuple(images.shape)}"
            )
        if self.pad == 0 or images.shape[0] == 0:
            return images
        rows, height, width = images.shape[0], images.shape[-2], images.shape[-1]
        device = images.device
        shifts = torch.randint(
            -self.pad, self.pad + 1, (2, rows), device=device, generator=self._generator(device)
        )
        y = (torch.arange(height, device=device)[None, :] + shifts[0][:, None]).clamp(0, height - 1)
        x = (torch.arange(width, device=device)[None, :] + shifts[1][:, None]).clamp(0, width - 1)
        flat = images.reshape(rows, -1, height, width)
        batch_index = torch.arange(rows, device=device)[:, None, None]
        # Advanced indices around a slice put their dims first: (rows, height, width, channels).
        shifted = flat[batch_index, :, y[:, :, None], x[:, None, :]]
        return shifted.permute(0, 3, 1, 2).reshape(images.shape)

    def __repr__(self) -> str:
        return f"RandomShift(pad={self.pad})"


__all__ = [
    "NEXT_OBSERVATION_KEY",
    "OBSERVATION_KEY",
    "Adaptor",
    "DictObsAdaptor",
    "KeyCastAdaptor",
    "KeyScaleAdaptor",
    "RandomShift",
    "SamplePreprocessor",
    "TerminalAdaptor",
    "Transform",
]
