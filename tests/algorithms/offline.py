"""What the tests of the offline families (bc, iql, cql) share: their spaces, the check of a
refused recipe table, and one training update run hook by hook as the Trainer runs it. Their
test modules train on one torch thread (``pytestmark``), where tiny networks train fastest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace

CPU = torch.device("cpu")
BOX = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (1,), -1.0, 1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (3,))}),
)
"""One action in [-1, 1] from a 3-wide observation ``obs``."""


def discrete_spaces(actions: int) -> MDPSpace:
    """``actions`` discrete actions from a 4-wide observation ``obs``."""
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=DiscreteSpace(n=actions),
        state=DictSpace({"obs": BoxSpace(np.float32, (4,))}),
    )


def two_keys(spaces: MDPSpace) -> MDPSpace:
    """``spaces``' actions from two observation keys, which a discrete family refuses."""
    return MDPSpace(
        rewards=spaces.rewards, actions=spaces.actions,
        state=DictSpace({"a": BoxSpace(np.float32, (1,)), "b": BoxSpace(np.float32, (1,))}),
    )  # fmt: skip


def update(callbacks: Sequence[Any], batch: Mapping[str, Any], step: int) -> dict[str, Any]:
    """One training step as the Trainer runs it: every callback's ``begin_batch``, then each
    ``backward`` in order, then ``end_batch``, each seeing what the ones before put in the data
    group; returns the data group."""
    state = {"default": dict(batch), "bp_step": step}
    for hook in ("begin_batch", "backward", "end_batch"):
        for callback in callbacks:
            if callback.overrides(hook):
                result = callback.call_hook(hook, state)
                state["default"].update((result or {}).get("default", {}))
    return state["default"]


def assert_refuses_table(family: Any, config: Any, key: str) -> None:
    """``family.validate`` refuses ``config`` in one line that starts with the recipe's name and
    matches ``key`` (a regular expression: the recipe key, say)."""
    with pytest.raises(ConfigurationError, match=key) as refused:
        family.validate(config, source="recipe.toml")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("recipe.toml: "), message
