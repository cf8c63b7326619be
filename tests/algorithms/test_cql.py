"""Conservative Q-Learning: its penalty against a hand computation (sampled Box actions with
their proposal densities, every discrete action under a mask), the proposals it samples, that
the penalty holds the values of actions outside the data below those of the data's actions, and
the tables it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from emote_core.algorithms.bc.losses import squashed_log_likelihood
from emote_core.algorithms.cql import (
    ConservativeQLearning,
    CqlConfig,
    CqlPolicyLoss,
    CqlProposals,
    CqlQLoss,
    DiscreteCqlQLoss,
    conservative_penalty,
)
from emote_core.algorithms.registry import BuildContext, get_algorithm
from emote_core.algorithms.sac import PolicyLoss
from emote_core.errors import ConfigurationError
from emote_core.nn import ActionValueMlp, DiscreteActionValueMlp, GaussianMlpPolicy
from emote_core.spaces import DiscreteSpace, MDPSpace
from tests.algorithms.offline import (
    BOX,
    CPU,
    assert_refuses_table,
    discrete_spaces,
    two_keys,
    update,
)

DISCRETE = discrete_spaces(3)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_penalty_is_the_log_sum_of_importance_weighted_exponentials_minus_the_data_value():
    sampled = torch.tensor([[[1.0]], [[2.0]], [[-1.0]]])  # 3 samples, 1 row
    densities = torch.tensor([[[math.log(0.5)]], [[0.0]], [[1.0]]])
    data = torch.tensor([[0.5]])
    expected = math.log(math.exp(1.0) / 0.5 + math.exp(2.0) + math.exp(-1.0 - 1.0)) - 0.5
    value = conservative_penalty(sampled, data, densities)
    assert value.shape == (1, 1) and float(value) == pytest.approx(expected, abs=1e-6)
    exact = conservative_penalty(sampled, data)  # every action, no proposal
    assert float(exact) == pytest.approx(math.log(math.e + math.e**2 + math.e**-1) - 0.5)


def test_the_continuous_loss_is_the_squared_error_plus_the_weighted_penalty_of_its_network():
    torch.manual_seed(0)
    q = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=[8])
    loss = CqlQLoss(name="q1", q=q, optimizer=torch.optim.Adam(q.parameters()),
                    conservative_weight=2.0)  # fmt: skip
    obs, actions = torch.randn(2, 3), torch.tensor([[0.3], [-0.6]])
    target = torch.tensor([[1.0], [-1.0]])
    sampled = torch.rand(4, 2, 1) * 2 - 1
    densities = torch.randn(4, 2, 1)
    value = loss.loss(observation={"obs": obs}, actions=actions, q_target=target,
                      cql_actions=sampled, cql_log_densities=densities)  # fmt: skip
    total = 0.0
    with torch.no_grad():
        for row in range(2):
            s = obs[row : row + 1]
            data_q = float(q(observation=s, actions=actions[row : row + 1]))
            terms = [float(q(observation=s, actions=sampled[j, row : row + 1]))
                     - float(densities[j, row]) for j in range(4)]  # fmt: skip
            penalty = math.log(sum(math.exp(t) for t in terms)) - data_q
            total += (data_q - float(target[row])) ** 2 + 2.0 * penalty
    assert float(value.detach()) == pytest.approx(total / 2, rel=1e-5)
    logged = loss.scalar_logs
    assert {"training/q1_cql_penalty", "training/q1_sampled_q", "training/q1_prediction"} <= set(
        logged
    )


def test_the_discrete_loss_sums_over_the_allowed_actions_only():
    torch.manual_seed(0)
    q = DiscreteActionValueMlp(observation_dim=4, num_actions=3, hidden_dims=[8])
    loss = DiscreteCqlQLoss(q=q, optimizer=torch.optim.Adam(q.parameters()), huber=False,
                            conservative_weight=0.5, action_mask_key="mask",
                            observation_keys=["obs"], name="policy")  # fmt: skip
    obs = torch.randn(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    actions, target = torch.tensor([[1], [2]]), torch.tensor([[0.5], [0.0]])
    value = loss.loss(observation={"obs": obs, "mask": mask}, actions=actions, q_target=target)
    with torch.no_grad():
        values = q(obs).tolist()
    total = 0.0
    for row, allowed in enumerate(([0, 1, 2], [0, 2])):
        data_q = values[row][int(actions[row])]
        penalty = math.log(sum(math.exp(values[row][a]) for a in allowed)) - data_q
        total += (data_q - float(target[row])) ** 2 + 0.5 * penalty
    assert float(value.detach()) == pytest.approx(total / 2, rel=1e-5)
    with pytest.raises(ConfigurationError, match="no action mask 'mask'"):
        loss.loss(observation={"obs": obs}, actions=actions, q_target=target)


def test_proposals_are_uniform_and_the_policy_at_s_and_at_s_prime_with_their_densities():
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=[8])
    proposals = CqlProposals(policy=policy, action_dim=2, sampled_actions=5)
    obs, next_obs = torch.randn(4, 3), torch.randn(4, 3) + 3.0
    out = proposals.begin_batch(observation={"obs": obs}, next_observation={"obs": next_obs},
                                rewards=torch.zeros(4, 1))["default"]  # fmt: skip
    actions, densities = out["cql_actions"], out["cql_log_densities"]
    assert actions.shape == (15, 4, 2) and densities.shape == (15, 4, 1)
    assert not actions.requires_grad and actions.abs().max() <= 1.0
    np.testing.assert_allclose(densities[:5], -2 * math.log(2.0))
    for block, states in ((slice(5, 10), obs), (slice(10, 15), next_obs)):
        mean, log_std = policy.head.distribution(policy.features(states))
        for sample in range(5):
            drawn = actions[block][sample]
            expected = squashed_log_likelihood(mean, log_std, drawn)
            np.testing.assert_allclose(densities[block][sample], expected.detach(), atol=2e-3)


def test_the_policy_clones_the_stored_actions_for_its_warm_up_then_follows_q() -> None:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=[8])
    q1, q2 = (ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=[8]) for _ in "12")
    ln_alpha = torch.tensor([math.log(0.3)], requires_grad=True)
    parts = {"policy": policy, "ln_alpha": ln_alpha, "q1": q1, "q2": q2}
    loss = CqlPolicyLoss(**parts, optimizer=torch.optim.SGD(policy.parameters(), lr=0.0),
                         bc_warmup_updates=2)  # fmt: skip
    sac_loss = PolicyLoss(**parts, optimizer=torch.optim.SGD(policy.parameters(), lr=0.0))
    obs, actions = torch.randn(4, 3), torch.tensor([[0.5], [-0.2], [0.9], [0.0]])
    batch = {"observation": {"obs": obs}, "actions": actions}

    def loss_at(step: int) -> float:
        torch.manual_seed(step)
        loss.backward(**batch, bp_step=step)
        return float(loss.scalar_logs["loss/policy"])

    for step in (1, 2):  # cloning: the samples' entropy term minus the stored actions' fit
        value = loss_at(step)
        torch.manual_seed(step)
        with torch.no_grad():
            _, log_probs = policy.sample(obs)
            mean, log_std = policy.head.distribution(policy.features(obs))
            fit = squashed_log_likelihood(mean, log_std, actions)
        assert value == pytest.approx(float((0.3 * log_probs - fit).mean()), rel=1e-5)
        assert "policy/log_likelihood" in loss.scalar_logs
    with torch.no_grad():  # Q's values do not enter the cloning loss
        for parameter in q1.parameters():
            parameter.mul_(5.0)
    assert loss_at(2) == pytest.approx(value, rel=1e-5)
    value = loss_at(3)  # after the warm-up (a resumed run included): SAC's loss on Q
    torch.manual_seed(3)
    assert value == pytest.approx(float(sac_loss.loss(observation={"obs": obs}).detach()), rel=1e-5)
    assert loss.capture_blocker() is not None
    assert CqlPolicyLoss(**parts, optimizer=torch.optim.SGD(policy.parameters(), lr=0.0)
                         ).capture_blocker() is None  # fmt: skip
    with pytest.raises(ConfigurationError, match="4 observations and 3 actions"):
        loss.backward(observation={"obs": obs}, actions=actions[:3], bp_step=1)


def train_cql(spaces: MDPSpace, config: CqlConfig, batch, updates: int):
    """Trains the family's callbacks, hook by hook, on one fixed batch; returns the networks."""
    family = ConservativeQLearning()
    torch.manual_seed(0)
    context = BuildContext(spaces=spaces, device=CPU, seed=0)
    networks = family.make_networks(config, context)
    callbacks = family.training_parts(config, networks, context).callbacks
    for step in range(1, updates + 1):
        update(callbacks, batch, step)
    return networks


def value_gap(networks, spaces: MDPSpace, obs: torch.Tensor, data_action: float) -> float:
    """The data action's value minus the mean value of actions far from it."""
    with torch.no_grad():
        if isinstance(spaces.actions, DiscreteSpace):
            values = networks.q(obs)
            return float(values[:, 0].mean() - values[:, 1:].mean())
        others = torch.tensor([-0.9, -0.6, -0.3, 0.0])
        data_q = networks.q1(observation=obs, actions=torch.full((len(obs), 1), data_action))
        other_q = torch.stack([
            networks.q1(observation=obs, actions=torch.full((len(obs), 1), float(a)))
            for a in others
        ])  # fmt: skip
        return float(data_q.mean() - other_q.mean())


@pytest.mark.parametrize("spaces", [BOX, DISCRETE], ids=["box", "discrete"])
def test_the_penalty_holds_values_of_actions_outside_the_data_below_the_data_actions(
    spaces: MDPSpace,
) -> None:
    generator = torch.Generator().manual_seed(1)
    width = spaces.state["obs"].shape[0]
    obs = torch.rand((32, width), generator=generator) * 2 - 1
    discrete = isinstance(spaces.actions, DiscreteSpace)
    data_action = 0.0 if discrete else 0.6  # the one action the data ever takes
    batch = {
        "observation": {"obs": obs},
        "next_observation": {"obs": obs.roll(1, dims=0)},
        "actions": torch.full((32, 1), data_action, dtype=torch.long if discrete else None),
        "rewards": torch.zeros(32, 1),
        "masks": torch.ones(32, 1),
    }
    gaps = {}
    for weight in (0.0, 1.0):
        config = CqlConfig(hidden_dims=[16], learning_rate=3e-3, conservative_weight=weight,
                           sampled_actions=4, gamma=0.5)  # fmt: skip
        gaps[weight] = value_gap(train_cql(spaces, config, batch, 100), spaces, obs, data_action)
    assert gaps[1.0] > 0.5 and gaps[1.0] > gaps[0.0] + 0.5, gaps


def test_cql_is_registered_offline_only_and_builds_sac_or_dqn_networks_by_action_kind():
    family = get_algorithm("cql")
    assert isinstance(family, ConservativeQLearning) and family.offline_only
    config = CqlConfig(hidden_dims=[8])
    for spaces, acting in ((BOX, GaussianMlpPolicy), (DISCRETE, DiscreteActionValueMlp)):
        context = BuildContext(spaces=spaces, device=CPU)
        networks = family.make_networks(config, context)
        assert isinstance(networks.acting, acting)
        names = [c.name for c in family.training_parts(config, networks, context).callbacks]
        # The acting network's callback: the policy, or the Q network acted on greedily.
        acting_callback = family.acting_callback_for(spaces)
        assert acting_callback == ("q" if spaces is DISCRETE else "policy")
        assert acting_callback in names
        agent = family.acting_agent(config, networks, context, deterministic=False)
        if spaces is DISCRETE:
            assert agent.epsilon == 0.0  # greedy also when asked to sample
    with pytest.raises(ConfigurationError, match="one observation key"):
        family.check_spaces(two_keys(DISCRETE), env_id="two-keys")


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"hidden_dims": []}, "'cql.hidden_dims'"),
        ({"hidden_dims": [16, 0]}, "'cql.hidden_dims'"),
        ({"learning_rate": 0.0}, "'cql.learning_rate'"),
        ({"policy_learning_rate": -1e-4}, "'cql.policy_learning_rate'"),
        ({"gamma": 1.5}, "'cql.gamma'"),
        ({"tau": 0.0}, "'cql.tau'"),
        ({"conservative_weight": -1.0}, "'cql.conservative_weight'"),
        ({"conservative_weight": math.inf}, "'cql.conservative_weight'"),
        ({"sampled_actions": 0}, "'cql.sampled_actions'"),
        ({"target_entropy": math.nan}, "'cql.target_entropy'"),
        ({"max_alpha": 0.0}, "'cql.max_alpha'"),
        ({"max_grad_norm": 0.0}, "'cql.max_grad_norm'"),
        ({"target_update_interval": 0}, "'cql.target_update_interval'"),
        ({"bc_warmup_updates": -1}, "'cql.bc_warmup_updates'"),
    ],
)
def test_cql_refuses_a_bad_table_in_one_line_naming_the_key(changes: dict, key: str) -> None:
    assert_refuses_table(ConservativeQLearning(), CqlConfig(**changes), key)
