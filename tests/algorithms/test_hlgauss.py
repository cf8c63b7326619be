"""HL-Gauss critics: histograms and cross-entropy against hand-worked values, the expected value
of a QNet, clipping, and a critic that learns a target."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.algorithms.dqn import DoubleDQN, DqnConfig, HLGaussQLoss
from emote_core.algorithms.dqn import QLoss as DqnQLoss
from emote_core.algorithms.dqn import QTarget as DqnQTarget
from emote_core.algorithms.dqn.family import DqnCritic
from emote_core.algorithms.hlgauss import (
    HLGaussConfig,
    HLGaussLoss,
    LogitNet,
    QLoss,
    QNet,
    hl_gauss_loss_for,
)
from emote_core.algorithms.registry import BuildContext
from emote_core.errors import ConfigurationError
from emote_core.nn import ActionLogitMlp, ActionValueMlp, DiscreteActionLogitMlp
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace

# Support [0, 4] in 4 bins with sigma = 1, target 2: the bins lie 2..1, 1..0, 0..1 and 1..2
# standard deviations from the target. With Phi(1) = 0.841345 and Phi(2) = 0.977250 the masses are
# 0.135905, 0.341345, 0.341345, 0.135905 (sum 0.954500), renormalised to the values below.
EDGE_PROB, MIDDLE_PROB = 0.135905 / 0.9545, 0.341345 / 0.9545  # 0.142384, 0.357616


def test_a_target_becomes_the_gaussian_integrated_over_each_bin() -> None:
    loss = HLGaussLoss(0.0, 4.0, 4, sigma=1.0)
    probs = loss.transform_to_probs(torch.tensor([[2.0]]))
    expected = torch.tensor([[EDGE_PROB, MIDDLE_PROB, MIDDLE_PROB, EDGE_PROB]])
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)


def test_a_target_on_the_edge_keeps_only_the_mass_inside_the_support() -> None:
    # Target 0 with sigma 1 over [0, 4]: masses Phi(1)-Phi(0), Phi(2)-Phi(1), ... renormalised by
    # Phi(4) - Phi(0) = 0.499968; the half of the Gaussian below 0 is dropped, not piled up.
    probs = HLGaussLoss(0.0, 4.0, 4, sigma=1.0).transform_to_probs(torch.tensor([0.0]))
    masses = torch.tensor([[0.341345, 0.135905, 0.021400, 0.001318]])
    torch.testing.assert_close(probs, masses / 0.499968, atol=1e-4, rtol=0)


def test_cross_entropy_by_hand() -> None:
    loss = HLGaussLoss(0.0, 4.0, 4, sigma=1.0)
    target = torch.tensor([[2.0]])
    # Uniform logits: -sum p log(1/4) = log 4 whatever p is.
    assert loss(torch.zeros(1, 4), target).item() == pytest.approx(math.log(4), abs=1e-6)
    # Logits equal to log p: the entropy of p, 2 * (0.142384 * 1.949233 + 0.357616 * 1.028296).
    best = torch.log(torch.tensor([[EDGE_PROB, MIDDLE_PROB, MIDDLE_PROB, EDGE_PROB]]))
    assert loss(best, target).item() == pytest.approx(1.290546, abs=1e-4)
    per_sample = loss(torch.zeros(3, 4), torch.tensor([0.5, 2.0, 3.5]), reduction="none")
    assert per_sample.shape == (3, 1)


@pytest.mark.parametrize("ratio", [0.5, 0.75])
def test_probabilities_sum_to_one_and_their_mean_recovers_the_target(ratio: float) -> None:
    q = QNet(ActionLogitMlp(observation_dim=1, action_dim=1, num_bins=51), -10.0, 40.0)
    loss = hl_gauss_loss_for(q, ratio)
    assert loss.sigma == pytest.approx(ratio * 50.0 / 51)
    targets = torch.linspace(-10.0, 40.0, 201)
    probs = loss.transform_to_probs(targets)
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(201), atol=1e-5, rtol=0)
    means = (probs * q.centers).sum(dim=1)
    # Near an edge the dropped tail pulls the mean inward (0.69 bins at most for 0.75);
    # five bins away from the edges it is exact to a hundredth of a bin.
    assert (means - targets).abs().max().item() < q.bin_width
    inside = (targets > -5.0) & (targets < 35.0)
    assert (means - targets)[inside].abs().max().item() < 0.01 * q.bin_width


def test_qnet_is_the_expected_value_over_bin_centres() -> None:
    logit_net = DiscreteActionLogitMlp(observation_dim=3, num_actions=2, num_bins=4)
    q = QNet(logit_net, 0.0, 4.0)
    torch.testing.assert_close(q.centers, torch.tensor([0.5, 1.5, 2.5, 3.5]))
    assert isinstance(logit_net, LogitNet)
    # One head (B, bins) -> (B, 1); one head per action (B, A, bins) -> (B, A).
    assert q.q_from_logit(torch.zeros(5, 4)).shape == (5, 1)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 50.0, 0.0]]])
    torch.testing.assert_close(q.q_from_logit(logits), torch.tensor([[2.0, 2.5]]))
    assert q(torch.zeros(5, 3)).shape == (5, 2)


def test_the_loss_clips_targets_and_logs_the_share_outside() -> None:
    torch.manual_seed(0)
    q = QNet(ActionLogitMlp(observation_dim=1, action_dim=1, num_bins=11), -1.0, 1.0)
    loss = QLoss(name="q1", q=q, optimizer=torch.optim.Adam(q.parameters(), lr=1e-3))
    batch = {"observation": {"obs": torch.zeros(4, 1)}, "actions": torch.zeros(4, 1)}
    far = loss.loss(**batch, q_target=torch.tensor([[5.0], [-7.0], [0.0], [1.0]]))
    assert loss.scalar_logs["training/q1_targets_clipped"] == 0.5
    edge = loss.loss(**batch, q_target=torch.tensor([[1.0], [-1.0], [0.0], [1.0]]))
    assert loss.scalar_logs["training/q1_targets_clipped"] == 0.0
    assert far.item() == pytest.approx(edge.item(), abs=1e-6)  # 5 counts as 1, -7 as -1


def test_the_critic_learns_a_value_and_publishes_td_errors() -> None:
    torch.manual_seed(0)
    q = QNet(ActionLogitMlp(observation_dim=1, action_dim=1, num_bins=21, hidden_dims=[32]),
             -10.0, 10.0)  # fmt: skip
    loss = QLoss(name="q1", q=q, optimizer=torch.optim.Adam(q.parameters(), lr=1e-2))
    observation, actions = torch.rand(64, 1), torch.rand(64, 1)
    q_target = 3.0 + observation  # values between bin centres
    batch = {"observation": {"obs": observation}, "actions": actions, "q_target": q_target}
    for step in range(300):
        out = loss.backward(**batch, bp_step=step)
    prediction = q(observation=observation, actions=actions)
    assert (prediction - q_target).abs().max().item() < 0.2
    assert out["default"]["q1_td_error"].shape == (64, 1)


def test_bad_supports_and_networks_are_refused() -> None:
    logits = ActionLogitMlp(observation_dim=1, action_dim=1, num_bins=5)
    with pytest.raises(ConfigurationError, match="min_value must be below max_value"):
        QNet(logits, 1.0, 1.0)
    with pytest.raises(ConfigurationError, match="num_bins must be an integer of at least 2"):
        HLGaussLoss(0.0, 1.0, 1, sigma=0.1)
    with pytest.raises(ConfigurationError, match="num_bins"):
        QNet(ActionValueMlp(observation_dim=1, action_dim=1), 0.0, 1.0)  # no num_bins
    with pytest.raises(ConfigurationError, match="smoothing_ratio must be a number above 0"):
        hl_gauss_loss_for(QNet(logits, 0.0, 1.0), 0.0)
    with pytest.raises(ConfigurationError, match="an HL-Gauss Q loss needs a QNet"):
        QLoss(name="q1", q=ActionValueMlp(observation_dim=1, action_dim=1),
              optimizer=torch.optim.Adam(logits.parameters()))  # fmt: skip


def test_the_table_is_checked_against_the_critic_it_serves() -> None:
    HLGaussConfig().check("mse", source="r", where="sac")
    with pytest.raises(ConfigurationError, match=re.escape('set sac.critic = "hl_gauss"')):
        HLGaussConfig(num_bins=11).check("mse", source="r", where="sac")
    with pytest.raises(
        ConfigurationError, match=re.escape("r: 'sac.hl_gauss': min_value must be below")
    ):
        HLGaussConfig(min_value=5.0, max_value=-5.0).check("hl_gauss", source="r", where="sac")


class FixedLogits(nn.Module):
    """Logits ``(B, 2 actions, 4 bins)`` that ignore the observation, for working by hand."""

    num_bins = 4

    def __init__(self, logits: list[list[float]]) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.tensor(logits))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.table.expand(observation.shape[0], -1, -1)


def test_dqn_loss_reads_the_head_of_the_taken_action() -> None:
    best = [math.log(p) for p in (EDGE_PROB, MIDDLE_PROB, MIDDLE_PROB, EDGE_PROB)]
    # Support [0, 4] in 4 bins with ratio 1: sigma = 1, the histograms of the first test.
    q = QNet(FixedLogits([[0.0, 0.0, 0.0, 0.0], best]), 0.0, 4.0)
    loss = HLGaussQLoss(q=q, optimizer=torch.optim.SGD(q.parameters(), lr=0.1), smoothing_ratio=1.0)
    observation = {"obs": torch.zeros(2, 3)}
    q_target = torch.tensor([[2.0], [2.0]])
    uniform = loss.loss(
        observation=observation, actions=torch.tensor([[0], [0]]), q_target=q_target
    )
    assert uniform.item() == pytest.approx(math.log(4), abs=1e-6)
    matched = loss.loss(
        observation=observation, actions=torch.tensor([[1], [1]]), q_target=q_target
    )
    assert matched.item() == pytest.approx(1.290546, abs=1e-4)
    assert loss.scalar_logs["training/q_prediction"] == pytest.approx(2.0, abs=1e-5)
    out = loss.backward(observation=observation, actions=torch.tensor([[0], [1]]),
                        q_target=torch.tensor([[3.0], [9.0]]), bp_step=1)  # fmt: skip
    torch.testing.assert_close(out["default"]["q_td_error"], torch.tensor([[-1.0], [-7.0]]))
    assert loss.scalar_logs["training/q_targets_clipped"] == 0.5


def test_dqn_target_bootstraps_the_expected_value_of_the_online_argmax() -> None:
    # Online: action 1 puts its mass on bin 3 (value 3.5), action 0 on bin 0 (0.5).
    online = QNet(FixedLogits([[50.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 50.0]]), 0.0, 4.0)
    target = QNet(FixedLogits([[0.0] * 4, [0.0] * 4]), 0.0, 4.0)
    q_target = DqnQTarget(q=online, q_target_network=target, gamma=0.5, tau=0.5)
    with torch.no_grad():  # the target network now disagrees: action 1 on bin 1 (1.5)
        target.logit_net.table.copy_(torch.tensor([[0.0, 0.0, 50.0, 0.0], [0.0, 50.0, 0.0, 0.0]]))
    batch = q_target.begin_batch(
        next_observation={"obs": torch.zeros(2, 3)},
        rewards=torch.tensor([[1.0], [1.0]]),
        masks=torch.tensor([[1.0], [0.0]]),
    )
    # Double DQN: argmax by the online network (action 1), value by the target (1.5).
    torch.testing.assert_close(batch["default"]["q_target"], torch.tensor([[1.75], [1.0]]))


@pytest.mark.parametrize(
    ("critic", "loss_type", "huber"),
    [("huber", DqnQLoss, True), ("mse", DqnQLoss, False), ("hl_gauss", HLGaussQLoss, None)],
)
def test_the_dqn_family_builds_the_critic_its_table_names(
    critic: str, loss_type: type, huber: bool | None
) -> None:
    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=DiscreteSpace(n=3),
        state=DictSpace({"obs": BoxSpace(np.float32, (4,))}),
    )
    config = DqnConfig(critic=DqnCritic(critic), hidden_dims=[8])
    if critic == "hl_gauss":
        config.hl_gauss = HLGaussConfig(num_bins=7, min_value=0.0, max_value=7.0)
    family = DoubleDQN()
    context = BuildContext(spaces=spaces, device=torch.device("cpu"))
    networks = family.make_networks(config, context)
    (loss,) = [c for c in family.training_parts(config, networks, context).callbacks
               if isinstance(c, DqnQLoss | HLGaussQLoss)]  # fmt: skip
    assert type(loss) is loss_type and networks.q(torch.zeros(2, 4)).shape == (2, 3)
    if huber is not None:
        assert loss.huber is huber
    else:
        assert loss.hl_gauss.sigma == pytest.approx(0.75) and networks.q.num_bins == 7
