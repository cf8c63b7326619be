"""VAELoss: it learns a known conditional action distribution from a table of demonstrations,
beta trades reconstruction for KL, and its checkpoint state round-trips."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from emote_core.algorithms.genrl import DecoderWrapper, VAELoss, make_vae
from emote_core.callbacks.compiled import compile_methods
from emote_core.errors import ConfigurationError, MissingStateKeyError
from emote_core.memory.loaders import MemoryLoader
from emote_core.trainer import Trainer
from tests.algorithms.genrl.demonstrations import (
    DEMONSTRATIONS_GROUP,
    TrainedVae,
    conditional_variance,
    demonstration_table,
    demonstrations,
    train_vae,
)


def held_out_errors(trained: TrainedVae) -> tuple[float, float]:
    """Reconstruction MSE on fresh demonstrations: from the posterior mean, and from a latent
    of zeros (what a decoder that ignored its latent could at best do)."""
    observations, actions = (torch.from_numpy(a) for a in demonstrations(2000, seed=99))
    with torch.no_grad():
        mean, _ = trained.vae.encode(actions, observations)
        from_mean = (trained.vae.decode(mean, observations) - actions).square().mean()
        from_zero = trained.vae.decode(torch.zeros_like(mean), observations) - actions
    return from_mean.item(), from_zero.square().mean().item()


def test_vae_loss_learns_the_conditional_action_distribution(trained: TrainedVae) -> None:
    observations, _ = demonstrations(200, seed=98)
    spread = conditional_variance(observations, seed=97)  # ~0.18: what the latent must explain
    from_mean, from_zero = held_out_errors(trained)
    assert from_mean < 0.1 * spread
    assert from_zero > 0.5 * spread  # the latent, not the observation alone, does the work
    logs = trained.loss.scalar_logs
    assert logs["vae/reconstruction"] < 0.05  # the last batch, with sampled latents
    assert 0.5 < logs["vae/kl"] < 10.0  # informative, yet near the prior


def test_the_logged_loss_is_reconstruction_plus_beta_kl(trained: TrainedVae) -> None:
    logs = trained.loss.scalar_logs
    expected = logs["vae/reconstruction"] + trained.vae.beta * logs["vae/kl"]
    assert logs["loss/vae"] == pytest.approx(expected, rel=1e-5)


def test_a_higher_beta_gives_a_lower_kl_and_a_worse_reconstruction() -> None:
    low, high = (train_vae(beta=beta, steps=200, seed=1) for beta in (0.001, 0.1))
    low_logs, high_logs = low.loss.scalar_logs, high.loss.scalar_logs
    assert high_logs["vae/kl"] < 0.5 * low_logs["vae/kl"]
    assert held_out_errors(high)[0] > 2 * held_out_errors(low)[0]


def new_loss(seed: int) -> VAELoss:
    torch.manual_seed(seed)
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(16,), beta=0.01)
    optimizer = torch.optim.Adam(vae.parameters(), lr=1e-3)
    return VAELoss(vae=vae, optimizer=optimizer, seed=seed, data_group=DEMONSTRATIONS_GROUP)


def test_the_state_dict_round_trips_network_optimizer_and_noise(one_torch_thread: None) -> None:
    loader = MemoryLoader(
        table=demonstration_table(episodes=4, length=10), rollout_count=8, rollout_length=1,
        data_group=DEMONSTRATIONS_GROUP,
    )  # fmt: skip
    original, restored = new_loss(seed=1), new_loss(seed=2)
    Trainer([original], itertools.islice(loader, 5)).train()
    saved = io.BytesIO()  # through a file, as checkpoints go: nothing shared between the two
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    for mine, theirs in zip(original.vae.parameters(), restored.vae.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)
    assert restored.scalar_logs == original.scalar_logs
    # The same batch now gives the same loss and the same step: noise and Adam moments match.
    batch = loader.sample()[DEMONSTRATIONS_GROUP]
    for callback in (original, restored):
        callback.backward(observation=batch["observation"], actions=batch["actions"])
    assert restored.scalar_logs["loss/vae"] == original.scalar_logs["loss/vae"]
    for mine, theirs in zip(original.vae.parameters(), restored.vae.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)


def test_a_vae_whose_decoder_is_frozen_is_refused() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(4,))
    DecoderWrapper(vae.decoder)
    with pytest.raises(ConfigurationError, match=r"parameters are frozen .* train the VAE before"):
        VAELoss(vae=vae, optimizer=torch.optim.Adam(vae.parameters()))


def test_a_batch_with_more_actions_than_observations_is_refused() -> None:
    loss = new_loss(seed=0)
    observation = {"obs": torch.zeros(4, 3)}
    with pytest.raises(ConfigurationError, match=r"4 observations and 8 actions") as caught:
        loss.loss(observation=observation, actions=torch.zeros(8, 2))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigurationError, match=r"must be a VariationalAutoencoder"):
        VAELoss(vae=torch.nn.Linear(2, 2), optimizer=torch.optim.Adam(loss.vae.parameters()))  # type: ignore[arg-type]


def test_the_loss_reads_its_own_data_group_only() -> None:
    loss = new_loss(seed=0)
    batch = {
        "default": {"observation": {"obs": torch.zeros(2, 3)}, "actions": torch.zeros(2, 2)},
        "batch_size": 2,
    }
    with pytest.raises(MissingStateKeyError, match=r"'vae'.*'observation'"):
        Trainer([loss], [batch]).train()


def test_the_compiled_loss_is_one_graph_and_trains_as_the_eager_one(
    one_torch_thread: None, graph_counts
) -> None:
    loader = MemoryLoader(
        table=demonstration_table(episodes=4, length=10), rollout_count=8, rollout_length=1,
        data_group=DEMONSTRATIONS_GROUP,
    )  # fmt: skip
    eager, compiled = new_loss(seed=3), new_loss(seed=3)
    assert compile_methods([compiled], backend="aot_eager") == 1
    for _ in range(5):
        batch = loader.sample()[DEMONSTRATIONS_GROUP]
        for callback in (eager, compiled):
            callback.backward(observation=batch["observation"], actions=batch["actions"])
    # The latent noise is drawn eagerly from the loss's generator, outside the graph.
    assert graph_counts() == (1, 0)
    assert compiled._generator.get_state().equal(eager._generator.get_state())
    for mine, theirs in zip(eager.vae.parameters(), compiled.vae.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)
    assert compiled.scalar_logs["vae/kl"] == pytest.approx(eager.scalar_logs["vae/kl"], rel=1e-5)


def test_a_condition_fn_gives_the_vae_its_condition_from_the_observation() -> None:
    vae = make_vae(observation_dim=2, action_dim=2, latent_dim=2, hidden_dims=(8,))
    loss = VAELoss(vae=vae, optimizer=torch.optim.Adam(vae.parameters()), seed=0,
                   condition_fn=lambda observation: observation[:, :2])  # fmt: skip
    observation, actions = {"obs": torch.randn(6, 5)}, torch.rand(6, 2)
    picked = VAELoss(vae=vae, optimizer=torch.optim.Adam(vae.parameters()), seed=0)
    expected = picked.loss(observation={"obs": observation["obs"][:, :2]}, actions=actions)
    torch.testing.assert_close(loss.loss(observation=observation, actions=actions), expected)
