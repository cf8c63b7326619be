"""GenRL's test data: a known action distribution, demonstrations of it in a table, and a VAE
trained on them.

Actions depend on the observation *and* on hidden noise, ``a = tanh(M s + 0.7 u)`` with
``s ~ N(0, I_3)`` and ``u ~ N(0, I_2)``: a decoder that ignored its latent could do no better than
the conditional variance of ``a`` given ``s``, so a small reconstruction error shows the latent
carries ``u``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from emote_core.algorithms.genrl import VAELoss, VariationalAutoencoder, make_vae
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.memory.proxy import MemoryProxy, MemoryTableProxy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import DictObservation, DictResponse, EpisodeState

OBSERVATION_DIM, ACTION_DIM, LATENT_DIM = 3, 2, 2
MIXING = np.array([[0.8, -0.5, 0.3], [0.2, 0.6, -0.7]], dtype=np.float32)
HIDDEN_NOISE = 0.7
TRAINING_STEPS = 400
DEMONSTRATIONS_GROUP = "demonstrations"


def demonstrated_actions(observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``tanh(M s + 0.7 u)`` per row, ``u`` standard normal."""
    hidden = rng.standard_normal((len(observations), ACTION_DIM)).astype(np.float32)
    return np.tanh(observations @ MIXING.T + HIDDEN_NOISE * hidden).astype(np.float32)


def demonstrations(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` observations and the actions demonstrated in them."""
    rng = np.random.default_rng(seed)
    observations = rng.standard_normal((count, OBSERVATION_DIM)).astype(np.float32)
    return observations, demonstrated_actions(observations, rng)


def conditional_variance(observations: np.ndarray, seed: int, draws: int = 400) -> float:
    """The mean over observations and action dimensions of ``Var[a | s]`` (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    repeated = np.repeat(observations, draws, axis=0)
    actions = demonstrated_actions(repeated, rng).reshape(len(observations), draws, ACTION_DIM)
    return float(actions.var(axis=1).mean())


def spaces(action_dim: int = ACTION_DIM) -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (action_dim,), low=-1.0, high=1.0),
        state=DictSpace({"obs": BoxSpace(np.float32, (OBSERVATION_DIM,))}),
    )


def step(state: EpisodeState, observation: np.ndarray, reward: float | None) -> DictObservation:
    return DictObservation(
        episode_state=state,
        array_data={"obs": observation},
        rewards={} if reward is None else {"reward": reward},
    )


def feed_episode(
    proxy: MemoryProxy, agent: int, observations: np.ndarray, actions: np.ndarray
) -> None:
    """One INTERRUPTED episode: ``len(actions)`` transitions, one more observation than actions."""
    for index, action in enumerate(actions):
        state = EpisodeState.INITIAL if index == 0 else EpisodeState.RUNNING
        reward = None if index == 0 else 0.0
        proxy.add({agent: step(state, observations[index], reward)},
                  {agent: DictResponse(list_data={"actions": action})})  # fmt: skip
    proxy.add({agent: step(EpisodeState.INTERRUPTED, observations[-1], 0.0)}, {})


def demonstration_table(episodes: int = 40, length: int = 25, seed: int = 0) -> DictObsMemoryTable:
    """A table of demonstrations, filled through a memory proxy as a collector would."""
    table = DictObsMemoryTable(spaces=spaces(), maxlen=episodes * length, seed=seed)
    proxy = MemoryTableProxy(table)
    for episode in range(episodes):
        observations, actions = demonstrations(length + 1, seed=1000 * seed + episode)
        feed_episode(proxy, 0, observations, actions[:length])
    return table


@dataclass
class TrainedVae:
    vae: VariationalAutoencoder
    loss: VAELoss
    seconds: float


def train_vae(
    *, beta: float, steps: int, seed: int = 0, latent_dim: int = LATENT_DIM
) -> TrainedVae:
    """A small VAE trained by :class:`VAELoss` on windows sampled from a demonstration table."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small networks; the machine's cores are shared
    try:
        torch.manual_seed(seed)
        vae = make_vae(
            observation_dim=OBSERVATION_DIM, action_dim=ACTION_DIM, latent_dim=latent_dim,
            hidden_dims=(32, 32), beta=beta,
        )  # fmt: skip
        loss = VAELoss(
            vae=vae, optimizer=torch.optim.Adam(vae.parameters(), lr=3e-3), seed=seed,
            data_group=DEMONSTRATIONS_GROUP,
        )  # fmt: skip
        loader = MemoryLoader(
            table=demonstration_table(seed=seed), rollout_count=64, rollout_length=1,
            data_group=DEMONSTRATIONS_GROUP,
        )  # fmt: skip
        started = time.perf_counter()
        Trainer([loss], itertools.islice(loader, steps)).train()
        return TrainedVae(vae, loss, time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
