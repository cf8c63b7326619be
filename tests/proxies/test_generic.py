"""GenericAgentProxy's uses_logprobs: reading policy outputs as upstream emote's argument says."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.proxies import FeatureAgentProxy, GenericAgentProxy
from emote_core.proxies.generic import LogProbsDroppedWarning
from emote_core.typing import DictObservation, EpisodeState


def observations(rows: list[list[float]]) -> dict[int, DictObservation]:
    return {
        agent: DictObservation(
            episode_state=EpisodeState.INITIAL,
            array_data={"obs": np.asarray(row, dtype=np.float32)},
            rewards={},
        )
        for agent, row in enumerate(rows)
    }


class ActionsLogProbsAndValue(nn.Module):
    """Returns (actions, log_probs, value) in any mode, as upstream policies do."""

    def forward(self, obs):
        return obs * 2.0, torch.full((obs.shape[0], 1), -99.0), obs.sum(dim=1, keepdim=True)


class OneTensor(nn.Module):
    def forward(self, obs):
        return obs + 1.0


def test_uses_logprobs_drops_the_second_output_and_fills_the_keys_with_the_rest() -> None:
    proxy = GenericAgentProxy(
        policy=ActionsLogProbsAndValue(), device="cpu", input_keys=["obs"],
        output_keys=["actions", "value"], uses_logprobs=True,
    )  # fmt: skip
    responses = proxy(observations([[1.0, 2.0], [3.0, -1.0]]))
    np.testing.assert_allclose(responses[0].list_data["actions"], [2.0, 4.0])
    np.testing.assert_allclose(responses[1].list_data["value"], [2.0])
    assert not any(np.any(r.list_data["value"] == -99.0) for r in responses.values())


def test_without_logprobs_the_one_output_goes_under_every_key() -> None:
    proxy = GenericAgentProxy(
        policy=OneTensor(), device="cpu", input_keys=["obs"],
        output_keys=["actions", "copy"], uses_logprobs=False,
    )  # fmt: skip
    response = proxy(observations([[1.0, 2.0]]))[0]
    np.testing.assert_allclose(response.list_data["actions"], [2.0, 3.0])
    np.testing.assert_allclose(response.list_data["copy"], [2.0, 3.0])


def test_mismatched_outputs_are_refused_with_the_argument_to_change() -> None:
    policy = GaussianMlpPolicy(observation_dim=2, action_dim=2, hidden_dims=(8,))
    proxy = GenericAgentProxy(
        policy=policy, device="cpu", input_keys=["obs"], output_keys=["actions"],
        uses_logprobs=True,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"returned Tensor in eval mode.*leave"):
        proxy(observations([[0.5, 0.5]]))
    too_many = GenericAgentProxy(
        policy=ActionsLogProbsAndValue(), device="cpu", input_keys=["obs"], output_keys=["a"]
    )  # three outputs for one key: neither reading fits
    with pytest.raises(ConfigurationError, match=r"returned 3 outputs.*one tensor per output key"):
        too_many(observations([[0.5, 0.5]]))
    single = GenericAgentProxy(
        policy=ActionsLogProbsAndValue(), device="cpu", input_keys=["obs"],
        output_keys=["actions"], uses_logprobs=False,
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="must return one tensor"):
        single(observations([[0.5, 0.5]]))
    with pytest.raises(ConfigurationError, match="uses_logprobs must be True, False"):
        GenericAgentProxy(policy=OneTensor(), device="cpu", input_keys=["obs"],
                          output_keys=["actions"], uses_logprobs="yes")  # fmt: skip


class ActionsAndLogProbs(nn.Module):
    def forward(self, obs):
        return obs * 2.0, torch.full((obs.shape[0], 1), -99.0)


def test_left_out_one_output_too_many_drops_the_second_with_a_warning_as_upstream() -> None:
    proxy = FeatureAgentProxy(policy=ActionsAndLogProbs(), device="cpu")
    with pytest.warns(LogProbsDroppedWarning, match="uses_logprobs=True"):
        first = proxy(observations([[1.0, 2.0]]))[0]
    np.testing.assert_allclose(first.list_data["actions"], [2.0, 4.0])
    said = FeatureAgentProxy(policy=ActionsAndLogProbs(), device="cpu", uses_logprobs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proxy(observations([[0.0, 1.0]]))  # warned once per proxy
        np.testing.assert_allclose(said(observations([[1.0, 1.0]]))[0].list_data["actions"], [2, 2])
