"""MemoryProxyWithEncoder: the replay table holds the latent (policy-space) actions of what the
agents did, and decoding them gives the agents' actions back."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from emote_core.algorithms.genrl import (
    DecoderWrapper,
    EncoderWrapper,
    MemoryProxyWithEncoder,
    make_vae,
    policy_to_latent,
)
from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.proxy import MemoryProxy, MemoryTableProxy
from emote_core.typing import DictResponse, EpisodeState
from tests.algorithms.genrl.demonstrations import TrainedVae, demonstrations, spaces, step

LATENT_SCALE = 2.0


def latent_table(latent_dim: int) -> DictObsMemoryTable:
    """A replay table whose actions are the latent policy's (``latent_dim`` wide)."""
    return DictObsMemoryTable(spaces=spaces(action_dim=latent_dim), maxlen=1000, seed=0)


def test_the_table_holds_the_encoders_scaled_means_for_each_agent() -> None:
    torch.manual_seed(0)
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=3, hidden_dims=(8,))
    with torch.no_grad():
        vae.encoder.head.weight.mul_(20.0)  # means beyond latent_scale, so the clamp shows
    table = latent_table(latent_dim=3)
    proxy = MemoryProxyWithEncoder(
        MemoryTableProxy(table), encoder=vae.encoder, latent_scale=LATENT_SCALE
    )
    assert isinstance(proxy, MemoryProxy)
    observations, actions = {}, {}
    for agent in (0, 1):  # two agents acting in the same steps, with different data
        observations[agent], actions[agent] = demonstrations(6, seed=10 + agent)
    for index in range(5):
        state = EpisodeState.INITIAL if index == 0 else EpisodeState.RUNNING
        reward = None if index == 0 else 1.0
        responses = {a: DictResponse(list_data={"actions": actions[a][index]}) for a in (0, 1)}
        given = copy.deepcopy(responses)
        proxy.add({a: step(state, observations[a][index], reward) for a in (0, 1)}, responses)
        for agent in (0, 1):  # the caller's responses still hold the environment actions
            np.testing.assert_array_equal(
                responses[agent].list_data["actions"], given[agent].list_data["actions"]
            )
    assert not proxy.is_initial(0)
    proxy.add({a: step(EpisodeState.TERMINAL, observations[a][5], 1.0) for a in (0, 1)}, {})
    assert proxy.is_initial(0) and table.episode_count == 2
    stored = {}
    for _, episode, _ in table.episodes():
        agent = 0 if np.array_equal(episode["obs"], observations[0]) else 1
        stored[agent] = episode["actions"]
    for agent in (0, 1):
        with torch.no_grad():
            means, _ = vae.encode(
                torch.from_numpy(actions[agent][:5]), torch.from_numpy(observations[agent][:5])
            )
        expected = np.clip(means.numpy() / LATENT_SCALE, -1.0, 1.0)
        assert stored[agent].shape == (5, 3)
        np.testing.assert_allclose(stored[agent], expected, rtol=1e-6, atol=1e-6)
    both = np.concatenate(list(stored.values()))
    assert np.abs(both).max() == 1.0 and (np.abs(both) < 1.0).any()


def test_decoding_the_stored_latents_gives_the_agents_actions_back(trained: TrainedVae) -> None:
    vae = copy.deepcopy(trained.vae)
    table = latent_table(latent_dim=2)
    proxy = MemoryProxyWithEncoder(
        MemoryTableProxy(table), encoder=EncoderWrapper(vae.encoder), latent_scale=LATENT_SCALE
    )
    observations, actions = demonstrations(201, seed=77)
    for index in range(200):
        state = EpisodeState.INITIAL if index == 0 else EpisodeState.RUNNING
        proxy.add({7: step(state, observations[index], None if index == 0 else 0.0)},
                  {7: DictResponse(list_data={"actions": actions[index]})})  # fmt: skip
    proxy.add({7: step(EpisodeState.INTERRUPTED, observations[200], 0.0)}, {})
    ((_, episode, _),) = list(table.episodes())
    decoder = DecoderWrapper(vae.decoder)
    with torch.no_grad():
        latents = policy_to_latent(torch.from_numpy(episode["actions"]), LATENT_SCALE)
        decoded = decoder(latents, torch.from_numpy(observations[:200])).numpy()
    assert np.mean((decoded - actions[:200]) ** 2) < 0.03


def test_steps_it_cannot_encode_are_refused_in_one_line() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(4,))
    proxy = MemoryProxyWithEncoder(
        MemoryTableProxy(latent_table(2)), encoder=vae.encoder, latent_scale=1.0
    )
    observation = {0: step(EpisodeState.INITIAL, np.zeros(3, np.float32), None)}
    with pytest.raises(ConfigurationError, match=r"response has no 'actions' \(it has \['act'\]\)"):
        proxy.add(observation, {0: DictResponse(list_data={"act": np.zeros(2, np.float32)})})
    wide = {0: DictResponse(list_data={"actions": np.zeros(5, np.float32)})}
    with pytest.raises(
        ConfigurationError, match=r"takes actions of width 2; got width 5"
    ) as caught:
        proxy.add(observation, wide)
    assert "\n" not in str(caught.value)
    assert proxy.is_initial(0)  # nothing reached the memory
    with pytest.raises(ConfigurationError, match=r"latent_scale must be finite and > 0"):
        MemoryProxyWithEncoder(MemoryTableProxy(latent_table(2)), encoder=vae.encoder,
                               latent_scale=float("nan"))  # fmt: skip
    keyed = MemoryProxyWithEncoder(
        MemoryTableProxy(latent_table(2)), encoder=vae.encoder, latent_scale=1.0,
        observation_keys=["position"],
    )  # fmt: skip
    with pytest.raises(
        ConfigurationError, match=r"observation has no 'position' \(it has \['obs'\]\)"
    ):
        keyed.add(observation, {0: DictResponse(list_data={"actions": np.zeros(2, np.float32)})})


def test_final_observations_pass_through_without_encoding() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(4,))
    table = latent_table(2)
    proxy = MemoryProxyWithEncoder(MemoryTableProxy(table), encoder=vae.encoder, latent_scale=1.0)
    # A final observation for an unknown agent is logged and skipped by the proxy underneath.
    proxy.add({3: step(EpisodeState.TERMINAL, np.zeros(3, np.float32), 1.0)}, {})
    assert table.episode_count == 0 and proxy.is_initial(3)


def test_a_whole_episode_gets_the_labels_its_steps_would_get() -> None:
    torch.manual_seed(1)
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=3, hidden_dims=(8,))
    observations, actions = demonstrations(7, seed=4)
    by_step, whole = latent_table(latent_dim=3), latent_table(latent_dim=3)
    stepped = MemoryProxyWithEncoder(
        MemoryTableProxy(by_step), encoder=vae.encoder, latent_scale=LATENT_SCALE
    )
    for index in range(6):
        state = EpisodeState.INITIAL if index == 0 else EpisodeState.RUNNING
        reward = None if index == 0 else 1.0
        response = DictResponse(list_data={"actions": actions[index]})
        stepped.add({0: step(state, observations[index], reward)}, {0: response})
    stepped.add({0: step(EpisodeState.TERMINAL, observations[6], 1.0)}, {})
    proxy = MemoryProxyWithEncoder(
        MemoryTableProxy(whole), encoder=vae.encoder, latent_scale=LATENT_SCALE
    )
    assert proxy.accepts_episodes
    sequence = {"obs": observations, "actions": actions[:6], "rewards": np.ones(6, np.float32)}
    proxy.add_episode(sequence, EpisodeState.TERMINAL)
    (_, expected, _), (_, got, _) = next(by_step.episodes()), next(whole.episodes())
    assert got["actions"].shape == (6, 3)
    np.testing.assert_allclose(got["actions"], expected["actions"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["obs"], expected["obs"])
    with pytest.raises(ConfigurationError, match="has no 'actions'"):
        proxy.add_episode({"obs": observations, "rewards": sequence["rewards"]}, 1)
