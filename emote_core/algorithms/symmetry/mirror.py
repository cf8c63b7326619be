"""Mirror maps: how a left-right reflection acts on a vector, as an index permutation and signs.

``mirror(x)[i] = signs[i] * x[permutation[i]]``. A reflection is its own inverse, so a map must
satisfy ``mirror(mirror(x)) == x``: the permutation swaps pairs (or keeps an index in place) and
the two indices of a swapped pair carry the same sign. LunarLander's continuous action
``[main engine, lateral engine]`` mirrors with ``permutation = [0, 1]``, ``signs = [1, -1]``;
its observation swaps the two leg contacts (indices 6 and 7) and negates x, the x velocity, the
angle and the angular velocity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from emote_core.errors import ConfigurationError


@dataclass(frozen=True)
class MirrorMap:
    """A reflection of the last dimension of a tensor or array.

    Attributes:
        permutation: ``permutation[i]`` is the index whose value lands at ``i``.
        signs: ``+1`` or ``-1`` per index, applied after the permutation.
    """

    permutation: tuple[int, ...]
    signs: tuple[float, ...]
    _tensors: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        *,
        permutation: Sequence[int] | None = None,
        signs: Sequence[float] | None = None,
        size: int | None = None,
        option: str = "mirror",
    ) -> MirrorMap:
        """A checked map; a missing permutation is the identity, missing signs are all +1.

        Args:
            permutation: The index permutation.
            signs: The signs.
            size: The width the map must have (the action or observation's); ``None`` takes it
                from the lists.
            option: Names the map in errors (``symmetry.action``).

        Raises:
            ConfigurationError: In one line, if neither list is given, a list has the wrong
                length, the permutation is not one of ``0 .. n-1``, a sign is not +-1, or the
                map is not its own inverse.
        """
        if permutation is None and signs is None:
            raise ConfigurationError(f"{option}: give a permutation, signs, or both")
        given = [len(x) for x in (permutation, signs) if x is not None]
        if size is None and len(set(given)) > 1:
            raise ConfigurationError(
                f"{option}_permutation has {given[0]} entries and {option}_signs {given[1]}; "
                "they must match"
            )
        width = size if size is not None else given[0]
        for what, values in (("permutation", permutation), ("signs", signs)):
            if values is not None and len(values) != width:
                raise ConfigurationError(
                    f"{option}_{what} has {len(values)} entries, but the "
                    f"{option.rsplit('.', 1)[-1]} has {width} dimensions"
                )
        order = tuple(range(width)) if permutation is None else tuple(permutation)
        if sorted(order) != list(range(width)) or any(isinstance(i, bool) for i in order):
            raise ConfigurationError(
                f"{option}_permutation must hold each index 0 .. {width - 1} once; "
                f"got {list(order)}"
            )
        flips = (1.0,) * width if signs is None else tuple(float(s) for s in signs)
        if any(sign not in (1.0, -1.0) for sign in flips):
            raise ConfigurationError(f"{option}_signs must be 1 or -1; got {list(signs or ())}")
        for i, j in enumerate(order):
            if order[j] != i or flips[i] != flips[j]:
                raise ConfigurationError(
                    f"{option} is not a reflection: mirroring twice must give the input back, "
                    f"but index {i} goes to {j} and {j} to {order[j]}"
                    + ("" if order[j] != i else " with different signs")
                )
        return cls(permutation=order, signs=flips)

    def __len__(self) -> int:
        return len(self.permutation)

    def __call__(self, values: Tensor) -> Tensor:
        """Mirrors the last dimension of ``values``."""
        key = (values.device, values.dtype)
        if key not in self._tensors:  # made once per device and dtype, not on every batch
            self._tensors[key] = (
                torch.as_tensor(self.permutation, device=values.device),
                torch.as_tensor(self.signs, dtype=values.dtype, device=values.device),
            )
        index, signs = self._tensors[key]
        return values.index_select(-1, index) * signs

    def numpy(self, values: np.ndarray) -> np.ndarray:
        """Mirrors the last dimension of an array."""
        return values[..., list(self.permutation)] * np.asarray(self.signs, dtype=values.dtype)


def symmetry_error(
    policy: Callable[[np.ndarray], np.ndarray],
    observations: np.ndarray,
    *,
    observation_mirror: MirrorMap,
    action_mirror: MirrorMap,
) -> float:
    """``mean |policy(mirror s) - mirror policy(s)|`` over states and action dimensions.

    0 for a policy that mirrors exactly (acting on a mirrored state as the mirror of its action
    on the state).

    Args:
        policy: Deterministic actions ``(N, A)`` for flat observations ``(N, D)``.
        observations: ``(N, D)`` states (from the policy's own episodes, say).
        observation_mirror: The observation's reflection.
        action_mirror: The action's reflection.
    """
    states = np.asarray(observations, dtype=np.float32)
    acted = np.asarray(policy(states))
    mirrored = np.asarray(policy(observation_mirror.numpy(states)))
    return float(np.abs(mirrored - action_mirror.numpy(acted)).mean())


__all__ = ["MirrorMap", "symmetry_error"]
