"""How dict observations become the one tensor a network takes.

Batches hold observations as ``{key: Tensor}`` (DESIGN.md, "Batch layout"); networks take one
tensor. :func:`flatten_observation` makes that tensor, and every algorithm callback calls it with
its ``observation_keys`` so that the choice of keys lives in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from emote_core.errors import ConfigurationError
from emote_core.spaces import DictSpace, MDPSpace


def _select_keys(available: Sequence[str], keys: Sequence[str] | None) -> list[str]:
    if keys is None:
        return sorted(available)
    if isinstance(keys, str):
        raise ConfigurationError(
            f"observation keys must be a sequence of key names, not the string {keys!r}; "
            f"write [{keys!r}]"
        )
    keys = list(keys)
    if not keys:
        raise ConfigurationError("observation keys must name at least one key (or be None)")
    missing = [key for key in keys if key not in available]
    if missing:
        raise ConfigurationError(
            f"observation keys {missing} are not in the observation, which has keys "
            f"{sorted(available)}; fix observation_keys"
        )
    return keys


def flatten_observation(
    observation: Mapping[str, Tensor],
    keys: Sequence[str] | None = None,
    *,
    flatten: bool = True,
) -> Tensor:
    """Turns a dict observation into one tensor.

    Args:
        observation: The observation tensors by key, each with a leading batch dimension.
        keys: The keys to use, in this order; ``None`` uses every key in sorted order.
        flatten: Flatten each entry to ``(B, -1)`` and concatenate along the last dimension.
            ``False`` returns the single selected entry unchanged (image observations for a
            convolutional encoder) and needs exactly one key.

    Returns:
        A ``(B, D)`` tensor (``flatten=True``), or the selected entry as it is. Entries of
        other dtypes than float32 (MuJoCo's float64, ``uint8`` frames, integers: kept exact in
        tables and stores) become float32, the networks' dtype, unscaled.

    Raises:
        ConfigurationError: If a key is missing, no key is selected, or ``flatten=False`` with
            other than one key.
    """
    selected = _select_keys(list(observation), keys)
    if not flatten:
        if len(selected) != 1:
            raise ConfigurationError(
                f"flatten=False returns one observation entry unchanged, but keys {selected} "
                "were selected; pass keys=[the_image_key]"
            )
        return observation[selected[0]]
    if len(selected) == 1:
        value = _network_dtype(observation[selected[0]])
        return value if value.dim() == 2 else value.reshape(value.shape[0], -1)
    parts = [_network_dtype(observation[key]) for key in selected]
    batch = parts[0].shape[0]
    return torch.cat([part.reshape(batch, -1) for part in parts], dim=-1)


def _network_dtype(value: Tensor) -> Tensor:
    # The networks are float32; tables keep observations exact (float64, uint8 frames, ints).
    return value if value.dtype == torch.float32 else value.float()


def observation_dim(spaces: MDPSpace | DictSpace, keys: Sequence[str] | None = None) -> int:
    """The width of :func:`flatten_observation`'s output for observations of ``spaces``.

    Args:
        spaces: An MDP space (its ``state`` is used) or a dict space of observations.
        keys: The keys :func:`flatten_observation` will be given.

    Returns:
        The sum over the selected keys of the product of each entry's shape.

    Raises:
        ConfigurationError: If a key is not in the space.
    """
    state = spaces.state if isinstance(spaces, MDPSpace) else spaces
    selected = _select_keys(state.keys(), keys)
    return int(sum(int(np.prod(state[key].shape)) for key in selected))


__all__ = ["flatten_observation", "observation_dim"]
