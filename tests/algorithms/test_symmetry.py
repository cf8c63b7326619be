"""Action symmetry: mirror maps, the discriminator's loss and the confusion reward against
hand-computed values, the symmetry error, and a discriminator that learns to tell."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.algorithms.symmetry import (
    ActionSymmetryAMPReward,
    ActionSymmetryDiscriminatorLoss,
    MirroredPairs,
    MirrorMap,
    confusion_reward,
    symmetry_error,
)
from emote_core.callbacks.compiled import compile_methods
from emote_core.errors import ConfigurationError
from emote_core.nn import Discriminator

LANDER_OBSERVATION = MirrorMap.build(
    permutation=[0, 1, 2, 3, 4, 5, 7, 6], signs=[-1, 1, -1, 1, -1, -1, 1, 1]
)
FLIP_SECOND = MirrorMap.build(signs=[1, -1])


def affine(w: float, b: float) -> nn.Linear:
    """``D(a) = w a + b``: two parameters, one-number actions."""
    network = nn.Linear(1, 1)
    with torch.no_grad():
        network.weight.fill_(w)
        network.bias.fill_(b)
    return network


def fixed(actions: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A "policy" that acts the same whatever it is shown."""

    def policy(observation: dict[str, torch.Tensor], *, generator: torch.Generator) -> torch.Tensor:
        assert next(iter(observation.values())).shape[0] == actions.shape[0]
        return actions

    return policy


def lander_policy(lopsided: float) -> Callable[..., torch.Tensor]:
    """Throttle even in x, side engine odd in x and the angle, plus ``lopsided`` to the side."""

    def policy(observation: dict[str, torch.Tensor], *, generator: torch.Generator) -> torch.Tensor:
        s = observation["obs"]
        noise = torch.randn(len(s), 2, generator=generator) * 0.05
        side = torch.tanh(s[:, 0] - s[:, 4]) + lopsided
        return torch.stack([s[:, 1] + s[:, 0] ** 2, side], dim=1) + noise

    return policy


def test_a_mirror_map_permutes_then_flips_signs_on_tensors_and_arrays_alike() -> None:
    values = np.arange(8, dtype=np.float32).reshape(1, 8) + 1
    expected = [[-1, 2, -3, 4, -5, -6, 8, 7]]
    assert LANDER_OBSERVATION.numpy(values).tolist() == expected
    assert LANDER_OBSERVATION(torch.from_numpy(values)).tolist() == expected
    twice = LANDER_OBSERVATION(LANDER_OBSERVATION(torch.from_numpy(values)))
    assert torch.equal(twice, torch.from_numpy(values))
    assert FLIP_SECOND.permutation == (0, 1) and len(FLIP_SECOND) == 2


@pytest.mark.parametrize(
    ("permutation", "signs", "size", "message"),
    [
        (None, None, None, "symmetry.action: give a permutation, signs, or both"),
        (
            [0, 1],
            [1],
            None,
            "symmetry.action_permutation has 2 entries and symmetry.action_signs 1",
        ),
        (None, [1, -1, 1], 2, "symmetry.action_signs has 3 entries, but the action has 2 dim"),
        ([0, 0], None, None, "symmetry.action_permutation must hold each index 0 .. 1 once"),
        ([0, 2], None, None, "symmetry.action_permutation must hold each index 0 .. 1 once"),
        (None, [1, 0.5], None, "symmetry.action_signs must be 1 or -1"),
        ([1, 2, 0], None, None, "symmetry.action is not a reflection: mirroring twice must give"),
        ([1, 0], [1, -1], None, "but index 0 goes to 1 and 1 to 0 with different signs"),
    ],
)
def test_a_map_that_is_no_reflection_of_the_right_size_is_refused_in_one_line(
    permutation: list[int] | None, signs: list[float] | None, size: int | None, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")) as raised:
        MirrorMap.build(permutation=permutation, signs=signs, size=size, option="symmetry.action")
    assert "\n" not in str(raised.value)


def test_the_confusion_reward_is_highest_where_the_discriminator_cannot_tell() -> None:
    scores = torch.tensor([0.0, 1.0, -1.0, 0.5, 3.0])
    mirrored = torch.tensor([0.0, -1.0, 1.0, -0.5, -3.0])
    # -(u^2 + m^2) / 2, scores clamped to [-1, 1] first: reversed scores earn nothing extra
    expected = [0.0, -1.0, -1.0, -0.25, -1.0]
    assert confusion_reward(scores, mirrored).tolist() == pytest.approx(expected)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "training.compile"])
def test_the_discriminator_loss_of_a_two_parameter_model_matches_the_hand_computed_value(
    compiled: bool,
) -> None:
    w, b, weight = 0.5, 0.25, 10.0
    network = affine(w, b)
    actions = torch.tensor([[1.0], [-2.0]])
    loss = ActionSymmetryDiscriminatorLoss(
        discriminator=network, optimizer=torch.optim.SGD(network.parameters(), lr=0.1),
        policy_actions=fixed(actions), action_mirror=MirrorMap.build(signs=[-1]),
        grad_loss_weight=weight,
    )  # fmt: skip
    if compiled:  # its gradient penalty cannot go through a compiled backward pass: left eager
        assert compile_methods([loss], backend="aot_eager") == 0
    unmirrored = [(w * a + b - 1) ** 2 for a in (1.0, -2.0)]
    mirrored = [(-w * a + b + 1) ** 2 for a in (1.0, -2.0)]
    expected = sum(unmirrored) / 2 + sum(mirrored) / 2 + weight * w**2  # dD/da = w
    value = loss.loss(observation={"obs": torch.zeros(2, 3)})
    assert value.item() == pytest.approx(expected)
    value.backward()  # d/dw: mean(2 (w a + b - 1) a) + mean(-2 (-w a + b + 1) a) + 2 weight w
    grad_w = sum(2 * (w * a + b - 1) * a - 2 * (-w * a + b + 1) * a for a in (1.0, -2.0)) / 2
    assert network.weight.grad.item() == pytest.approx(grad_w + 2 * weight * w)


def test_pairs_join_the_flattened_observation_and_the_action_each_mirrored() -> None:
    pairs = MirroredPairs(action_mirror=FLIP_SECOND, observation_mirror=LANDER_OBSERVATION,
                          observation_keys=None, owner="t")  # fmt: skip
    state = torch.arange(1.0, 9.0).reshape(1, 8)
    unmirrored, mirrored = pairs({"obs": state}, torch.tensor([[0.3, 0.7]]))
    assert unmirrored[0].tolist() == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8, 0.3, 0.7])
    assert mirrored[0].tolist() == pytest.approx([-1, 2, -3, 4, -5, -6, 8, 7, 0.3, -0.7])
    with pytest.raises(ConfigurationError, match="the batch's observations have 3 dimensions"):
        pairs({"obs": torch.zeros(1, 3)}, torch.zeros(1, 2))


def test_the_reward_callback_adds_the_weighted_confusion_reward_in_the_rewards_shape() -> None:
    network = affine(1.0, 0.0)  # D(a) = a: D(x) = a, D(mirror x) = -a
    callback = ActionSymmetryAMPReward(discriminator=network, confusion_reward_weight=2.0,
                                       action_mirror=MirrorMap.build(signs=[-1]))  # fmt: skip
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    actions = torch.tensor([[0.0], [1.0], [-1.0]])
    out = callback.begin_batch(actions=actions, rewards=rewards)
    # a = 0: cannot tell, 0; a = 1: told apart, -1; a = -1: told backwards, also -1
    assert out["default"]["rewards"].flatten().tolist() == pytest.approx([1.0, -1.0, -1.0])
    assert out["default"]["rewards"].shape == (3, 1)
    centred = ActionSymmetryAMPReward(discriminator=network, confusion_reward_weight=2.0,
                                      action_mirror=MirrorMap.build(signs=[-1]),
                                      center_on_batch=True)  # fmt: skip
    out = centred.begin_batch(actions=actions, rewards=rewards)  # confusion mean: -2 / 3
    expected = [1.0 + 2.0 * (c + 2.0 / 3.0) for c in (0.0, -1.0, -1.0)]
    assert out["default"]["rewards"].flatten().tolist() == pytest.approx(expected)
    with pytest.raises(ConfigurationError, match="confusion_reward_weight must be finite"):
        ActionSymmetryAMPReward(discriminator=network, confusion_reward_weight=-1.0,
                                action_mirror=FLIP_SECOND)  # fmt: skip


def test_the_symmetry_error_is_zero_for_a_mirroring_policy_and_measures_the_others() -> None:
    states = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)

    def mirroring(s: np.ndarray) -> np.ndarray:  # throttle even in x, side odd in x and angle
        return np.stack([s[:, 1] + s[:, 0] ** 2, np.tanh(s[:, 0] - s[:, 4])], axis=1)

    def lopsided(s: np.ndarray) -> np.ndarray:  # always pushes right: error |1 - (-1)| / 2
        return np.stack([s[:, 1], np.ones(len(s))], axis=1)

    maps = {"observation_mirror": LANDER_OBSERVATION, "action_mirror": FLIP_SECOND}
    assert symmetry_error(mirroring, states, **maps) == pytest.approx(0.0, abs=1e-6)
    assert symmetry_error(lopsided, states, **maps) == pytest.approx(1.0)


def test_the_discriminator_learns_to_tell_lopsided_actions_and_not_symmetric_ones() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)

    def trained(actions: torch.Tensor) -> float:
        network = Discriminator(input_dim=2, hidden_dims=[32])
        loss = ActionSymmetryDiscriminatorLoss(
            discriminator=network, optimizer=torch.optim.Adam(network.parameters(), lr=1e-2),
            policy_actions=fixed(actions), action_mirror=FLIP_SECOND, grad_loss_weight=0.1,
        )  # fmt: skip
        for _ in range(300):
            loss.backward(observation={"obs": torch.zeros(len(actions), 1)})
        reward = ActionSymmetryAMPReward(discriminator=network, action_mirror=FLIP_SECOND)
        rewards = torch.zeros(len(actions), 1)
        return reward.begin_batch(actions=actions, rewards=rewards)["default"]["rewards"].mean()

    noise = torch.rand(512, 2, generator=generator) * 2 - 1
    lopsided = torch.stack([noise[:, 0], noise[:, 1].abs()], dim=1)  # side engine: right only
    assert trained(lopsided) < -0.6  # told apart: towards -1
    assert abs(trained(noise)) < 0.1  # as many left as right: cannot tell, about 0


def test_policy_pairs_hold_the_same_states_with_the_policy_and_its_mirror_image() -> None:
    pairs = MirroredPairs(action_mirror=FLIP_SECOND, observation_mirror=LANDER_OBSERVATION,
                          observation_keys=None, owner="t")  # fmt: skip
    seen = []

    def policy(observation: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append(observation["obs"])
        s = observation["obs"]
        return torch.stack([s[:, 1], s[:, 0]], dim=1)  # side engine follows x: it mirrors

    state = torch.arange(1.0, 9.0).reshape(1, 8)
    unmirrored, mirrored = pairs.policy_pairs({"obs": state}, policy)
    (both,) = seen  # one call on the states and their mirror images
    assert both.tolist() == [list(range(1, 9)), [-1, 2, -3, 4, -5, -6, 8, 7]]
    assert unmirrored[0].tolist() == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8, 2, 1])
    # pi(m s) = [2, -1]; its mirror image [2, 1], beside the same (unmirrored) state
    assert mirrored[0].tolist() == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8, 2, 1])
    alone = MirroredPairs(action_mirror=FLIP_SECOND, observation_mirror=None,
                          observation_keys=None, owner="t")  # fmt: skip
    acted, flipped = alone.policy_pairs({"obs": state}, policy)
    assert acted.tolist() == [[2, 1]] and flipped.tolist() == [[2, -1]]


def test_the_observation_mirror_reflects_the_named_keys_in_their_shapes_and_keeps_the_rest() -> (
    None
):
    pairs = MirroredPairs(action_mirror=FLIP_SECOND,
                          observation_mirror=MirrorMap.build(permutation=[1, 0, 2],
                                                             signs=[1, 1, -1]),
                          observation_keys=["b", "a"], owner="t")  # fmt: skip
    observation = {"a": torch.tensor([[3.0]]), "b": torch.tensor([[[1.0], [2.0]]]),
                   "c": torch.tensor([[9.0]])}  # fmt: skip
    mirrored = pairs.mirror_observation(observation)
    assert mirrored["b"].tolist() == [[[2.0], [1.0]]] and mirrored["a"].tolist() == [[-3.0]]
    assert mirrored["c"] is observation["c"]


@pytest.mark.parametrize(("lopsided", "told"), [(0.0, False), (0.5, True)])
def test_the_discriminator_tells_a_lopsided_policy_not_a_mirroring_one_on_lopsided_states(
    lopsided: float, told: bool
) -> None:
    torch.manual_seed(0)
    # Every state has the lander right of centre: a discriminator that compared the states with
    # their mirror images would tell them apart by the states alone, whatever the policy did.
    states = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
    states[:, 0] = states[:, 0].abs() + 0.5
    observation = {"obs": states}
    network = Discriminator(input_dim=10, hidden_dims=[64])
    policy = lander_policy(lopsided)
    maps = {"action_mirror": FLIP_SECOND, "observation_mirror": LANDER_OBSERVATION}
    loss = ActionSymmetryDiscriminatorLoss(
        discriminator=network, optimizer=torch.optim.Adam(network.parameters(), lr=3e-3),
        policy_actions=policy, grad_loss_weight=0.1, **maps,
    )  # fmt: skip
    for _ in range(300):
        loss.backward(observation=observation)
    reward = ActionSymmetryAMPReward(discriminator=network, **maps)
    acted = policy(observation, generator=torch.Generator().manual_seed(2))
    rewards = reward.begin_batch(
        actions=acted, rewards=torch.zeros(512, 1), observation=observation
    )
    confusion = rewards["default"]["rewards"].mean().item()
    assert confusion < -0.5 if told else confusion > -0.1


def test_the_sampling_generator_is_checkpointed_with_the_discriminator() -> None:
    network = Discriminator(input_dim=2, hidden_dims=[8])
    draws = []

    def policy(observation: dict[str, torch.Tensor], *, generator: torch.Generator) -> torch.Tensor:
        draws.append(torch.rand(1, generator=generator).item())
        return torch.zeros(len(observation["obs"]), 2)

    loss = ActionSymmetryDiscriminatorLoss(
        discriminator=network, optimizer=torch.optim.Adam(network.parameters()),
        policy_actions=policy, action_mirror=FLIP_SECOND, seed=3,
    )  # fmt: skip
    batch = {"obs": torch.zeros(4, 1)}
    loss.loss(observation=batch)
    state = loss.state_dict()
    loss.loss(observation=batch)
    loss.load_state_dict(state)
    loss.loss(observation=batch)
    assert draws[1] == draws[2] != draws[0]


def test_sac_networks_sample_their_policy_for_add_ons_and_other_networks_say_they_cannot() -> None:
    from emote_core.algorithms.registry import Networks
    from emote_core.algorithms.sac.family import SacNetworks
    from emote_core.nn import GaussianMlpPolicy

    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=[8])
    networks = SacNetworks(policy=policy, q1=nn.Identity(), q2=nn.Identity(),
                           ln_alpha=torch.zeros(1))  # fmt: skip
    observation = {"obs": torch.randn(5, 3)}

    def sampled(seed: int) -> torch.Tensor:
        return networks.policy_actions(observation, generator=torch.Generator().manual_seed(seed))

    actions = sampled(0)
    assert actions.shape == (5, 2) and not actions.requires_grad
    assert actions.abs().max() <= 1.0
    assert torch.equal(actions, sampled(0)) and not torch.equal(actions, sampled(1))

    class Acting(Networks):
        @property
        def acting(self) -> nn.Module:
            return nn.Identity()

    with pytest.raises(ConfigurationError, match="Acting cannot sample its policy's actions"):
        Acting().policy_actions(observation)
