"""What the MBPO callbacks share: the held-out split of episodes, argument checks, the batch's
observation rows and generator states in checkpoints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from emote_core.errors import ConfigurationError

_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: spreads consecutive ids evenly


def is_holdout(identities: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each episode identity is held out from model training.

    About ``fraction`` of all identities are, spread evenly over consecutive ones (Fibonacci
    hashing of ``identity + 1``): of a collector's episodes 0, 1, 2, ... the 5th, 10th, ... are
    held out at 0.2, and the first never is. The choice depends on the identity alone, so it
    survives resumes and store round trips.
    """
    ids = np.asarray(identities, dtype=np.int64).astype(np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        hashed = ids * _FIBONACCI  # wraps modulo 2^64, on purpose
    return (hashed >> np.uint64(40)).astype(np.float64) / float(1 << 24) < fraction


def check_holdout_fraction(owner: str, fraction: Any) -> float:
    """``fraction`` as a float if it is a number in ``[0, 1)``; else a one-line error."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ConfigurationError(f"{owner}: holdout_fraction must be a number; got {fraction!r}")
    if not 0.0 <= fraction < 1.0:
        raise ConfigurationError(
            f"{owner}: holdout_fraction must be in [0, 1); got {fraction} (0 trains on every "
            "episode and scores the model on training data)"
        )
    return float(fraction)


def observation_rows(owner: str, observation: Any, key: str) -> Tensor:
    """The ``key`` entry of dict observations (the observations themselves otherwise)."""
    if isinstance(observation, Mapping):
        if key not in observation:
            raise ConfigurationError(
                f"{owner}: the batch's observations have no '{key}' (they have "
                f"{sorted(observation)}); set input_key"
            )
        return observation[key]
    return observation


def save_generator(state: dict[str, Any], generator: torch.Generator) -> None:
    """Stores ``generator``'s state in ``state["generator_state"]``."""
    state["generator_state"] = generator.get_state()


def load_generator(state: Mapping[str, Any], generator: torch.Generator) -> None:
    """Restores ``generator`` from ``state["generator_state"]`` when it is there."""
    saved = state.get("generator_state")
    if saved is not None:
        generator.set_state(saved)


__all__ = [
    "check_holdout_fraction",
    "is_holdout",
    "load_generator",
    "observation_rows",
    "save_generator",
]
