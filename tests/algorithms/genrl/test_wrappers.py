"""The encoder for labelling, the frozen decoder, the latent policy, and the scaling convention
that joins them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from emote_core.algorithms.genrl import (
    DecoderWrapper,
    EncoderWrapper,
    PolicyWrapper,
    latent_to_policy,
    make_vae,
    policy_to_latent,
)
from emote_core.errors import ConfigurationError
from emote_core.nn.policies import GaussianMlpPolicy
from tests.algorithms.genrl.demonstrations import TrainedVae, demonstrations

LATENT_SCALE = 3.0


def frozen_copy(trained: TrainedVae) -> tuple[EncoderWrapper, DecoderWrapper]:
    """Wrappers around a copy, so the session's VAE stays trainable for other tests."""
    vae = copy.deepcopy(trained.vae)
    return EncoderWrapper(vae.encoder), DecoderWrapper(vae.decoder)


def latent_policy(latent_dim: int = 2, seed: int = 0) -> GaussianMlpPolicy:
    torch.manual_seed(seed)
    return GaussianMlpPolicy(observation_dim=3, action_dim=latent_dim, hidden_dims=(16,))


def test_the_decoder_wrapper_passes_gradients_to_the_latent_only() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(8,))
    decoder = DecoderWrapper(vae.decoder)
    latent = torch.randn(5, 2, requires_grad=True)
    decoder(latent, torch.randn(5, 3)).sum().backward()
    assert latent.grad is not None and latent.grad.abs().sum().item() > 0
    assert all(not p.requires_grad and p.grad is None for p in vae.decoder.parameters())
    decoder.train()
    assert decoder.training and not vae.decoder.training  # the frozen decoder stays in eval mode


def test_the_encoder_wrapper_gives_the_posterior_mean_without_gradients() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=4, hidden_dims=(8,))
    actions, observations = torch.rand(6, 2), torch.randn(6, 3)
    means = EncoderWrapper(vae.encoder)(actions, observations)
    torch.testing.assert_close(means, vae.encode(actions, observations)[0])
    assert means.shape == (6, 4) and not means.requires_grad


def test_the_policy_wrapper_acts_within_the_action_bounds() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(8,))
    with torch.no_grad():
        vae.decoder.head.weight.mul_(50.0)  # push the decoder toward its bounds
    wrapper = PolicyWrapper(latent_policy(), DecoderWrapper(vae.decoder), latent_scale=10.0)
    generator = torch.Generator().manual_seed(0)
    observations = 10 * torch.randn(500, 3, generator=generator)
    actions = wrapper(observations, 5 * torch.randn(500, 2, generator=generator))
    assert actions.shape == (500, 2)
    assert actions.abs().max().item() <= 1.0
    assert actions.abs().max().item() > 0.99  # the bound is reached, not merely never tested


def test_the_policy_wrapper_decodes_latent_scale_times_the_policy_action() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(8,))
    decoder, policy = DecoderWrapper(vae.decoder), latent_policy()
    wrapper = PolicyWrapper(policy, decoder, latent_scale=LATENT_SCALE)
    observations, epsilon = torch.randn(7, 3), torch.randn(7, 2)
    expected = decoder(LATENT_SCALE * policy.act(observations, epsilon), observations)
    torch.testing.assert_close(wrapper(observations, epsilon), expected)
    # No noise and zero noise are both the deterministic action, in either mode.
    wrapper.train()
    torch.testing.assert_close(wrapper(observations), wrapper(observations, torch.zeros(7, 2)))
    assert wrapper.latent_dim == 2 and wrapper.action_dim == 2


def test_the_scaling_convention_maps_inside_the_range_both_ways_and_clamps_outside() -> None:
    policy_actions = torch.tensor([[-1.0, -0.25, 0.0, 0.5, 1.0]])
    latents = policy_to_latent(policy_actions, LATENT_SCALE)
    assert latents.tolist() == [[-3.0, -0.75, 0.0, 1.5, 3.0]]
    torch.testing.assert_close(latent_to_policy(latents, LATENT_SCALE), policy_actions)
    beyond = latent_to_policy(torch.tensor([[-7.5, 4.0]]), LATENT_SCALE)
    assert beyond.tolist() == [[-1.0, 1.0]]  # the policy cannot reach further


def test_encoding_then_decoding_through_the_wrappers_round_trips_actions(
    trained: TrainedVae,
) -> None:
    encoder, decoder = frozen_copy(trained)
    observations, actions = (torch.from_numpy(a) for a in demonstrations(1000, seed=55))
    stored = latent_to_policy(encoder(actions, observations), LATENT_SCALE)  # what SAC sees
    assert stored.abs().max().item() <= 1.0
    with torch.no_grad():
        decoded = decoder(policy_to_latent(stored, LATENT_SCALE), observations)
        unscaled = decoder(stored, observations)  # a slip in the convention
    error = (decoded - actions).square().mean().item()
    assert error < 0.03  # the VAE's own error (see test_losses)
    assert (unscaled - actions).square().mean().item() > 2 * error


@pytest.mark.parametrize("latent_scale", [0.0, -1.0, float("inf"), True])
def test_a_latent_scale_that_is_not_positive_and_finite_is_refused(latent_scale: float) -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(8,))
    with pytest.raises(ConfigurationError, match=r"latent_scale must be finite and > 0") as caught:
        PolicyWrapper(latent_policy(), DecoderWrapper(vae.decoder), latent_scale=latent_scale)
    assert "\n" not in str(caught.value)


def test_mismatched_widths_are_refused_in_one_line() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=4, hidden_dims=(8,))
    decoder = DecoderWrapper(vae.decoder)
    with pytest.raises(ConfigurationError, match=r"action_dim 2 but the decoder's latent_dim is 4"):
        PolicyWrapper(latent_policy(latent_dim=2), decoder, latent_scale=1.0)
    with pytest.raises(ConfigurationError, match=r"latent_dim is 3 but the decoder's is 4"):
        DecoderWrapper(vae.decoder, latent_dim=3)
    with pytest.raises(ConfigurationError, match=r"must be a DecoderWrapper"):
        PolicyWrapper(latent_policy(latent_dim=4), vae.decoder, latent_scale=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"takes latents of width 4; got width 2"):
        decoder(torch.zeros(1, 2), torch.zeros(1, 3))
    with pytest.raises(ConfigurationError, match=r"takes actions of width 2; got width 4"):
        EncoderWrapper(vae.encoder)(torch.zeros(1, 4), torch.zeros(1, 3))


def test_a_condition_fn_picks_what_conditions_the_encoder_and_the_decoder() -> None:
    vae = make_vae(observation_dim=2, action_dim=2, latent_dim=2, hidden_dims=(8,))
    first_two = lambda observation: observation[:, :2]  # noqa: E731
    observations, actions, latents = torch.randn(4, 5), torch.rand(4, 2), torch.randn(4, 2)
    torch.testing.assert_close(
        EncoderWrapper(vae.encoder, first_two)(actions, observations),
        EncoderWrapper(vae.encoder)(actions, observations[:, :2]),
    )
    decoder = DecoderWrapper(vae.decoder, first_two)
    torch.testing.assert_close(
        decoder(latents, observations), vae.decoder(latents, observations[:, :2])
    )
    with pytest.raises(ConfigurationError, match=r"observations of width 2; got width 5"):
        DecoderWrapper(vae.decoder)(latents, observations)


def test_a_decoder_declaring_upstreams_input_size_gives_the_latent_width() -> None:
    decoder = nn.Linear(3, 2)
    decoder.input_size = 3  # upstream emote's decoders name their latent width so
    assert DecoderWrapper(decoder).latent_dim == 3


def test_sample_decodes_a_policy_sample_and_returns_its_log_probabilities() -> None:
    vae = make_vae(observation_dim=3, action_dim=2, latent_dim=2, hidden_dims=(8,))
    wrapper = PolicyWrapper(latent_policy(), DecoderWrapper(vae.decoder), latent_scale=LATENT_SCALE)
    observations, epsilon = torch.randn(7, 3), torch.randn(7, 2)
    actions, log_probs = wrapper.sample(observations, epsilon)
    torch.testing.assert_close(actions, wrapper(observations, epsilon))
    expected = wrapper.policy.sample(observations, epsilon)[1]
    assert log_probs.shape == (7, 1) and torch.equal(log_probs, expected)
    without = PolicyWrapper(nn.Linear(3, 2), DecoderWrapper(vae.decoder), latent_scale=1.0)
    with pytest.raises(ConfigurationError, match=r"needs a policy with sample"):
        without.sample(observations)
