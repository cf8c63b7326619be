"""Random generators into checkpoints and back, so that a resumed run draws what it would have.

Objects that draw random numbers (tables, agent proxies, collectors) name their generators in a
``random_generators()`` method; :func:`capture` turns those into values a checkpoint holds
(``torch.load(weights_only=True)`` reads them) and :func:`restore` puts them back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from emote_core.errors import CheckpointError

Generator = np.random.Generator | torch.Generator


@runtime_checkable
class HasRandomGenerators(Protocol):
    """Something whose random draws belong in a checkpoint."""

    def random_generators(self) -> Mapping[str, Generator]:
        """Its generators by a name that is stable across runs."""
        ...


def capture(generators: Mapping[str, Generator]) -> dict[str, Any]:
    """The states of ``generators``: a numpy generator's as JSON text (its 128-bit integers do
    not fit a tensor), a torch generator's as its byte tensor."""
    state: dict[str, Any] = {}
    for name, generator in generators.items():
        if isinstance(generator, np.random.Generator):
            state[name] = {"numpy": json.dumps(generator.bit_generator.state)}
        else:
            state[name] = {"torch": generator.get_state(), "device": str(generator.device)}
    return state


def restore(
    generators: Mapping[str, Generator],
    state: Mapping[str, Any],
    *,
    owner: str,
    strict: bool = True,
) -> list[str]:
    """Sets ``generators`` to the states :func:`capture` took.

    Args:
        generators: The generators to set, by name.
        state: What :func:`capture` returned.
        owner: Who holds them, for messages.
        strict: Refuse generators without a saved state of their kind; otherwise they are left
            as they are and returned (an agent swapped for another kind between two runs).

    Returns:
        The names of the generators left as they were (only when not ``strict``).

    Raises:
        CheckpointError: When ``strict``, if a generator has no saved state, or one of another
            kind.
    """
    unmatched = []
    for name, generator in generators.items():
        saved = state.get(name, {})
        if isinstance(generator, np.random.Generator) and "numpy" in saved:
            generator.bit_generator.state = json.loads(saved["numpy"])
        elif isinstance(generator, torch.Generator) and "torch" in saved:
            generator.set_state(saved["torch"])
        else:
            unmatched.append(name)
    if unmatched and strict:
        raise CheckpointError(
            f"the checkpoint holds no random state for {owner}'s generators {unmatched} (it holds "
            f"{sorted(state)}) — was it written by another kind of run?"
        )
    return unmatched


def generators_of(owner: object, prefix: str = "") -> dict[str, Generator]:
    """``owner.random_generators()`` with names prefixed, or nothing for an object that draws
    no random numbers of its own."""
    if not isinstance(owner, HasRandomGenerators):
        return {}
    return {f"{prefix}{name}": g for name, g in owner.random_generators().items()}


__all__ = ["Generator", "HasRandomGenerators", "capture", "generators_of", "restore"]
