"""Gaussian policies: tanh-squashed samples, their log-probabilities, and eval-mode actions."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Independent, Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Conv2dEncoder
from emote_core.nn.policies import (
    BasePolicy,
    GaussianMlpPolicy,
    GaussianPolicy,
    GaussianPolicyHead,
)


def make_policy(observation_dim: int = 5, action_dim: int = 3) -> GaussianMlpPolicy:
    torch.manual_seed(0)
    return GaussianMlpPolicy(
        observation_dim=observation_dim, action_dim=action_dim, hidden_dims=(32, 32)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_probs_match_a_tanh_transformed_gaussian(seed: int) -> None:
    policy = make_policy()
    generator = torch.Generator().manual_seed(seed)
    observation = torch.randn(64, 5, generator=generator) * 3
    epsilon = torch.randn(64, 3, generator=generator)
    actions, log_probs = policy(observation, epsilon)

    mean, log_std = policy.head.distribution(policy.features(observation))
    reference = TransformedDistribution(
        Independent(Normal(mean, log_std.exp()), 1), [TanhTransform(cache_size=1)]
    )
    # Squashing through the cached transform lets log_prob invert it exactly (atanh would lose
    # precision near +-1).
    expected_actions = reference.transforms[0](mean + log_std.exp() * epsilon)
    expected = reference.log_prob(expected_actions).unsqueeze(-1)

    assert log_probs.shape == (64, 1)
    torch.testing.assert_close(actions, expected_actions)
    torch.testing.assert_close(log_probs, expected, atol=1e-4, rtol=1e-4)


def test_log_probs_stay_finite_for_saturated_actions() -> None:
    head = GaussianPolicyHead(hidden_dim=4, action_dim=2)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.copy_(torch.tensor([30.0, -30.0, -5.0, -5.0]))  # means at +-30
    actions, log_probs = head.sample(torch.zeros(8, 4))
    assert torch.all(actions.abs() <= 1.0)
    assert torch.isfinite(log_probs).all()


def test_training_samples_are_reparameterised_and_inside_the_action_box() -> None:
    policy = make_policy()
    actions, log_probs = policy(torch.randn(128, 5))
    assert actions.shape == (128, 3)
    assert torch.all(actions.abs() <= 1.0)
    (actions.sum() + log_probs.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


def test_eval_mode_is_a_deterministic_function_of_observation_and_epsilon() -> None:
    policy = make_policy().eval()
    observation = torch.randn(10, 5)
    zeros = torch.zeros(10, 3)
    first = policy(observation, zeros)
    assert isinstance(first, torch.Tensor) and first.shape == (10, 3)
    torch.testing.assert_close(policy(observation, zeros), first, rtol=0, atol=0)

    epsilon = torch.randn(10, 3)
    noisy = policy(observation, epsilon)
    torch.testing.assert_close(policy(observation, epsilon.clone()), noisy, rtol=0, atol=0)
    assert not torch.equal(noisy, first)

    mean, log_std = policy.head.distribution(policy.features(observation))
    torch.testing.assert_close(noisy, torch.tanh(mean + log_std.exp() * epsilon))
    torch.testing.assert_close(first, torch.tanh(mean))
    torch.testing.assert_close(policy(observation), first)  # no epsilon: the mean action


def test_sample_and_act_do_not_depend_on_the_module_mode() -> None:
    policy = make_policy()
    observation, epsilon = torch.randn(4, 5), torch.randn(4, 3)
    training = policy.sample(observation, epsilon)
    policy.eval()
    evaluated = policy.sample(observation, epsilon)
    torch.testing.assert_close(training, evaluated)
    torch.testing.assert_close(policy.act(observation, epsilon), training[0])


def test_log_std_is_clamped() -> None:
    head = GaussianPolicyHead(hidden_dim=2, action_dim=1, log_std_min=-3.0, log_std_max=0.5)
    with torch.no_grad():
        head.linear.weight.fill_(100.0)
    _, log_std = head.distribution(torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    assert log_std.tolist() == [[0.5], [-3.0]]


def test_a_vision_policy_reads_images_through_its_encoder() -> None:
    encoder = Conv2dEncoder(input_shape=(16, 16, 3), channels=[4], kernels=[4], strides=[2])
    policy = GaussianPolicy(
        encoder=encoder, encoder_output_dim=encoder.output_dim, action_dim=2, hidden_dims=(16,),
        detach_encoder=True,
    )  # fmt: skip
    actions, log_probs = policy(torch.rand(6, 16, 16, 3))
    assert actions.shape == (6, 2) and log_probs.shape == (6, 1)
    (actions.sum() + log_probs.sum()).backward()
    assert all(p.grad is None for p in encoder.parameters())  # detached: the Q losses train it


def test_bad_sizes_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="action_dim"):
        GaussianPolicyHead(hidden_dim=4, action_dim=0)
    with pytest.raises(ConfigurationError, match="log_std_min"):
        GaussianPolicyHead(hidden_dim=4, action_dim=1, log_std_min=1.0, log_std_max=0.0)
    with pytest.raises(ConfigurationError, match="hidden_dims"):
        GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=(64, -1))


def test_policies_are_base_policies_that_infer_pre_and_post_actions() -> None:
    policy = make_policy()
    assert isinstance(policy, BasePolicy)
    observation = torch.randn(4, 5)
    for training in (True, False):
        policy.train(training)
        torch.manual_seed(1)
        pre, post = policy.infer(observation)
        torch.manual_seed(1)
        sampled, _ = policy.sample(observation)
        assert torch.equal(pre, sampled) and torch.equal(post, pre)  # the identity post_process


def test_a_base_policy_subclass_changes_only_post_processing() -> None:
    class Rounded(BasePolicy):
        def forward(self, observation):
            return observation * 0.6, torch.zeros(observation.shape[0], 1)

        def post_process(self, actions):
            return actions.round()

    pre, post = Rounded().infer(torch.tensor([[1.0, 2.0]]))
    torch.testing.assert_close(pre, torch.tensor([[0.6, 1.2]]))
    assert post.tolist() == [[1.0, 1.0]]
