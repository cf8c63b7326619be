"""The shared vocabulary in emote_core.typing."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Callable

import pytest
import torch

from emote_core.typing import RewardFnType


def distance_reward(actions: torch.Tensor, next_observations: torch.Tensor) -> torch.Tensor:
    return -next_observations.abs().sum(dim=-1) - 0.1 * actions.square().sum(dim=-1)


def roll_out(
    reward_fn: RewardFnType, actions: torch.Tensor, next_obs: torch.Tensor
) -> torch.Tensor:
    return reward_fn(actions, next_obs)


def test_reward_fn_type_resolves_to_a_function_of_actions_and_next_observations() -> None:
    hints = typing.get_type_hints(roll_out)
    assert hints["reward_fn"] == Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rewards = roll_out(distance_reward, torch.zeros(3, 2), torch.ones(3, 4))
    torch.testing.assert_close(rewards, torch.full((3,), -4.0))


def test_importing_the_typing_module_does_not_import_torch() -> None:
    code = "import sys, emote_core.typing; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_dict_observation_refuses_upstreams_positional_field_order() -> None:
    import numpy as np

    from emote_core.typing import DictObservation, EpisodeState

    # Upstream emote: DictObservation(rewards, episode_state, array_data, metadata).
    with pytest.raises(TypeError, match="positional"):
        DictObservation({"reward": 1.0}, EpisodeState.RUNNING, {"obs": np.zeros(2)})  # type: ignore[misc]
    built = DictObservation(
        rewards={"reward": 1.0}, episode_state=EpisodeState.RUNNING, array_data={"obs": np.zeros(2)}
    )
    assert built.episode_state is EpisodeState.RUNNING and built.rewards == {"reward": 1.0}
