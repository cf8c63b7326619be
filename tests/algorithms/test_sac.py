"""SAC callbacks: target math by hand, target networks, the shared temperature, and learning."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.algorithms.sac import AlphaLoss, PolicyLoss, QLoss, QTarget, soft_update_from_to
from emote_core.callback import Order
from emote_core.callbacks.checkpointing import Checkpointer, CheckpointLoader
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import CheckpointError, ConfigurationError, MissingStateKeyError
from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.nn.action_value import ActionValueMlp
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.schedules import ConstantSchedule, LinearSchedule
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (1,), -1.0, 1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (1,))}),
)


class FixedPolicy(nn.Module):
    """Always proposes action 0.5 with log-probability -1 (so targets can be worked out by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def sample(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = observation.shape[0]
        return torch.full((rows, 1), 0.5), torch.full((rows, 1), -1.0)


class LinearQ(nn.Module):
    """``Q(s, a) = ws * s + wa * a``."""

    def __init__(self, ws: float, wa: float) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[ws, wa]]))

    def forward(self, observation: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([observation, actions], dim=-1))


def add_episode(table, identity, observations, actions, rewards, end_state) -> None:
    table.add_sequence(
        identity,
        {
            "obs": np.asarray(observations, np.float32).reshape(-1, 1),
            "actions": np.asarray(actions, np.float32).reshape(-1, 1),
            "rewards": np.asarray(rewards, np.float32),
        },
        end_state=end_state,
    )


def hand_target(**overrides) -> QTarget:
    q1, q2 = LinearQ(1.0, 2.0), LinearQ(3.0, 0.0)
    settings = {
        "policy": FixedPolicy(), "ln_alpha": torch.tensor([math.log(0.2)], requires_grad=True),
        "q1": q1, "q2": q2, "q1_target": LinearQ(0, 0), "q2_target": LinearQ(0, 0),
        "gamma": 0.9, "reward_scale": 2.0,
    }  # fmt: skip
    settings.update(overrides)
    return QTarget(**settings)


def soft_value(next_obs: float) -> float:
    """min(1 * s + 2 * 0.5, 3 * s) - 0.2 * (-1): the fixed policy's soft value."""
    return min(next_obs + 1.0, 3.0 * next_obs) + 0.2


def test_one_step_targets_stop_at_terminal_and_bootstrap_interrupted() -> None:
    table = DictObsMemoryTable(spaces=SPACES, maxlen=100)
    add_episode(table, 0, [0.0, 1.0], [0.2], [1.0], EpisodeState.TERMINAL)
    add_episode(table, 1, [2.0, 3.0], [-0.4], [2.0], EpisodeState.INTERRUPTED)
    batch = table.sample_all()
    assert batch["masks"].flatten().tolist() == [0.0, 1.0]

    result = hand_target().begin_batch(batch["next_observation"], batch["rewards"], batch["masks"])
    q_target = result["default"]["q_target"]
    assert q_target.shape == (2, 1)
    # TERMINAL: 2 * 1 only. INTERRUPTED: 2 * 2 + 0.9 * (min(3 + 1, 9) + 0.2) = 7.78.
    torch.testing.assert_close(q_target.flatten(), torch.tensor([2.0, 7.78]))


def test_without_masks_every_transition_is_bootstrapped() -> None:
    table = DictObsMemoryTable(spaces=SPACES, maxlen=100)
    add_episode(table, 0, [0.0, 1.0], [0.2], [1.0], EpisodeState.TERMINAL)
    batch = table.sample_all()
    callback = hand_target(use_masks=False)
    q_target = callback.begin_batch(batch["next_observation"], batch["rewards"])["default"]
    torch.testing.assert_close(q_target["q_target"], torch.tensor([[2.0 + 0.9 * soft_value(1)]]))
    assert callback.scalar_logs["training/q_target"] == pytest.approx(2.0 + 0.9 * soft_value(1))


@pytest.mark.parametrize("table_type", [DictObsNStepMemoryTable, DictObsMemoryTable])
def test_three_step_targets_by_hand(table_type: type) -> None:
    table = table_type(spaces=SPACES, maxlen=100)
    add_episode(table, 7, [0, 1, 2, 4], [0.1, 0.1, 0.1], [1, 2, 3], EpisodeState.TERMINAL)
    add_episode(table, 8, [0, 1, 2, 5], [0.1, 0.1, 0.1], [1, 1, 1], EpisodeState.INTERRUPTED)
    batch = table.sample_by_index([7, 8], [0, 0], 3)
    callback = hand_target(rollout_length=3)
    q_target = callback.begin_batch(batch["next_observation"], batch["rewards"], batch["masks"])
    g = 0.9
    expected = [
        2.0 * (1 + g * 2 + g**2 * 3),  # TERMINAL: no bootstrap from observation 4
        2.0 * (1 + g + g**2) + g**3 * soft_value(5.0),
    ]
    torch.testing.assert_close(q_target["default"]["q_target"].flatten(), torch.tensor(expected))


def test_q_loss_regresses_each_windows_first_transition() -> None:
    q = LinearQ(1.0, 1.0)
    loss = QLoss(name="q1", q=q, optimizer=torch.optim.SGD(q.parameters(), lr=0.0))
    observation = {"obs": torch.tensor([[1.0], [9.0], [9.0], [2.0], [9.0], [9.0]])}
    actions = torch.tensor([[0.5], [9.0], [9.0], [1.0], [9.0], [9.0]])
    q_target = torch.tensor([[1.5], [4.0]])  # predictions 1.5 and 3.0 on the first rows
    value = loss.loss(observation=observation, actions=actions, q_target=q_target)
    assert value.item() == pytest.approx((0.0 + 1.0) / 2)
    assert loss.scalar_logs["training/q1_prediction"] == pytest.approx(2.25)


def test_q_loss_weights_each_window_by_its_importance_weight_and_publishes_td_errors() -> None:
    q = LinearQ(1.0, 1.0)
    loss = QLoss(name="q1", q=q, optimizer=torch.optim.SGD(q.parameters(), lr=0.0))
    observation = {"obs": torch.tensor([[1.0], [9.0], [2.0], [9.0]])}
    actions = torch.tensor([[0.5], [9.0], [1.0], [9.0]])
    q_target = torch.tensor([[2.5], [4.0]])  # predictions 1.5 and 3.0: errors -1 and -1
    weights = torch.tensor([[0.2], [0.2], [1.0], [1.0]])  # per step, as a table gives them
    value = loss.loss(
        observation=observation, actions=actions, q_target=q_target, importance_weights=weights
    )
    assert value.item() == pytest.approx((0.2 * 1.0 + 1.0 * 1.0) / 2)
    assert loss.loss(observation=observation, actions=actions, q_target=q_target).item() == 1.0
    out = loss.backward(observation=observation, actions=actions, q_target=q_target, bp_step=7)
    published = out["default"]
    torch.testing.assert_close(published["q1_td_error"], torch.tensor([[-1.0], [-1.0]]))
    assert published["q1_td_error_step"] == 7


def test_prioritized_sac_trains_through_the_trainer_and_moves_priorities() -> None:
    from emote_core.memory.priorities import PriorityUpdater
    from emote_core.memory.strategies import PrioritizedSampleStrategy

    table = DictObsMemoryTable(
        spaces=SPACES, maxlen=10_000, seed=0, sampler=PrioritizedSampleStrategy(alpha=1.0)
    )
    rng = np.random.default_rng(0)
    for identity in range(20):
        obs = rng.normal(size=(6, 1)).astype(np.float32)
        actions = rng.uniform(-1, 1, size=(5, 1)).astype(np.float32)
        add_episode(table, identity, obs, actions, actions[:, 0] ** 2, EpisodeState.TERMINAL)
    callbacks, _ = sac_callbacks()
    callbacks += [PriorityUpdater(table=table, losses=["q1", "q2"]),
                  BackPropStepsTerminator(bp_steps=20)]  # fmt: skip
    Trainer(callbacks, MemoryLoader(table=table, rollout_count=16, rollout_length=1)).train()
    priorities = np.concatenate([table.sampler.priorities(s) for s in table.index.live_slots()])
    assert (priorities != 1.0).sum() > 50  # most sampled windows took their TD error


def test_targets_start_as_copies_and_follow_by_polyak_averaging() -> None:
    torch.manual_seed(0)
    q1 = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=(8,))
    q2 = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=(8,))
    q1_target = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=(8,))
    callback = QTarget(
        policy=GaussianMlpPolicy(observation_dim=1, action_dim=1, hidden_dims=(8,)),
        ln_alpha=torch.zeros(1, requires_grad=True), q1=q1, q2=q2, q1_target=q1_target,
        q2_target=copy.deepcopy(q2), target_q_tau=0.25,
    )  # fmt: skip
    for online, target in zip(q1.parameters(), q1_target.parameters(), strict=True):
        assert torch.equal(online, target) and not target.requires_grad
    before = [p.detach().clone() for p in q1_target.parameters()]
    with torch.no_grad():
        for parameter in q1.parameters():
            parameter.add_(1.0)
    callback.end_batch()
    for old, online, target in zip(before, q1.parameters(), q1_target.parameters(), strict=True):
        torch.testing.assert_close(target, 0.75 * old + 0.25 * online)


def test_soft_update_from_to_moves_the_target_a_fraction_tau_toward_the_source() -> None:
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    target = copy.deepcopy(source)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(1.0)
        source[1].running_mean.fill_(5.0)
    before = [p.detach().clone() for p in target.parameters()]
    soft_update_from_to(source, target, 0.1)
    for old, online, moved in zip(before, source.parameters(), target.parameters(), strict=True):
        torch.testing.assert_close(moved, 0.9 * old + 0.1 * online)
    torch.testing.assert_close(target[1].running_mean, torch.full((3,), 5.0))


def test_soft_update_from_to_refuses_a_tau_outside_zero_to_one() -> None:
    network = nn.Linear(1, 1)
    with pytest.raises(ConfigurationError, match=r"tau must be in \[0.0, 1.0\]; got 1.5"):
        soft_update_from_to(network, copy.deepcopy(network), 1.5)


def test_target_sharing_parameters_with_its_network_is_refused() -> None:
    q = LinearQ(1, 1)
    with pytest.raises(ConfigurationError, match=r"copy\.deepcopy"):
        hand_target(q1=q, q1_target=q)


def test_missing_masks_are_a_clear_error() -> None:
    table = DictObsMemoryTable(spaces=SPACES, maxlen=100)
    add_episode(table, 0, [0.0, 1.0], [0.2], [1.0], EpisodeState.TERMINAL)
    batch = table.sample_all()
    with pytest.raises(ConfigurationError, match="use_masks=False"):
        hand_target().begin_batch(batch["next_observation"], batch["rewards"])


def sac_callbacks(
    *, hidden: tuple[int, ...] = (32, 32), lr: float = 3e-3, seed: int = 0, **alpha_options
) -> tuple[list, dict]:
    torch.manual_seed(seed)
    policy = GaussianMlpPolicy(observation_dim=1, action_dim=1, hidden_dims=hidden)
    q1 = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=hidden)
    q2 = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=hidden)
    ln_alpha = torch.zeros(1, requires_grad=True)
    parts = {"policy": policy, "q1": q1, "q2": q2, "ln_alpha": ln_alpha}
    callbacks = [
        QTarget(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2, q1_target=copy.deepcopy(q1),
                q2_target=copy.deepcopy(q2)),
        QLoss(name="q1", q=q1, optimizer=torch.optim.Adam(q1.parameters(), lr=lr)),
        QLoss(name="q2", q=q2, optimizer=torch.optim.Adam(q2.parameters(), lr=lr)),
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2,
                   optimizer=torch.optim.Adam(policy.parameters(), lr=lr)),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=1,
                  optimizer=torch.optim.Adam([ln_alpha], lr=lr), **alpha_options),
    ]  # fmt: skip
    return callbacks, parts


def bandit_table(episodes: int = 1000, seed: int = 0) -> DictObsMemoryTable:
    """One-step TERMINAL episodes with random actions and reward -(a - 0.5)^2."""
    table = DictObsMemoryTable(spaces=SPACES, maxlen=10_000, seed=seed)
    rng = np.random.default_rng(seed)
    for identity in range(episodes):
        action = rng.uniform(-1.0, 1.0)
        add_episode(
            table, identity, [1.0, 1.0], [action], [-((action - 0.5) ** 2)], EpisodeState.TERMINAL
        )
    return table


def test_sac_learns_the_best_action_of_a_continuous_bandit(one_torch_thread: None) -> None:
    callbacks, parts = sac_callbacks()
    loader = MemoryLoader(table=bandit_table(), rollout_count=64, rollout_length=1)
    assert callbacks[0].order == Order.TARGET and callbacks[1].order == Order.DEFAULT
    state = Trainer([*callbacks, BackPropStepsTerminator(bp_steps=500)], loader).train()
    assert state["bp_step"] == 500
    action = parts["policy"].act(torch.ones(1, 1)).item()
    assert action == pytest.approx(0.5, abs=0.1)
    q_loss = callbacks[1].scalar_logs["loss/q1"]
    assert q_loss < 0.01
    assert callbacks[4].scalar_logs["training/alpha"] < 0.5  # the temperature came down from 1


def test_policy_loss_leaves_no_gradients_on_the_q_networks() -> None:
    callbacks, parts = sac_callbacks(hidden=(8,))
    policy_loss = callbacks[3]
    batch = bandit_table(episodes=20).sample(16, 1)
    policy_loss.backward(**batch)
    assert all(p.grad is None for p in parts["q1"].parameters())
    assert all(p.requires_grad for p in parts["q1"].parameters())
    assert all(p.grad is not None for p in parts["policy"].parameters())
    assert "training/policy_entropy" in policy_loss.scalar_logs


def test_alpha_is_clamped_and_the_target_entropy_schedule_advances() -> None:
    schedule = LinearSchedule(-1.0, -3.0, 4)
    callbacks, parts = sac_callbacks(hidden=(8,), max_alpha=2.0, target_entropy=schedule)
    with torch.no_grad():
        parts["ln_alpha"].fill_(math.log(50.0))
    alpha_loss = callbacks[4]
    batch = bandit_table(episodes=20).sample(16, 1)
    for _ in range(4):
        alpha_loss.backward(**batch)
        alpha_loss.end_batch()  # steps the schedule, as the trainer does after backward
    assert parts["ln_alpha"].exp().item() <= 2.0 + 1e-6
    assert alpha_loss.scalar_logs["training/alpha"] <= 2.0 + 1e-6
    assert schedule.steps_taken == 4 and alpha_loss.target_entropy_value == -3.0
    assert alpha_loss.scalar_logs["training/alpha_target_entropy"] == pytest.approx(-2.5)


def test_ln_alpha_is_shared_and_restored_for_every_holder(tmp_path) -> None:
    callbacks, parts = sac_callbacks(hidden=(8,))
    loader = MemoryLoader(table=bandit_table(episodes=100), rollout_count=16, rollout_length=1)
    checkpointer = Checkpointer(callbacks=callbacks, run_dir=tmp_path, checkpoint_interval=1000)
    Trainer([*callbacks, checkpointer, BackPropStepsTerminator(bp_steps=30)], loader).train()
    trained_alpha = parts["ln_alpha"].item()
    assert trained_alpha != 0.0
    assert all(c.ln_alpha is parts["ln_alpha"] for c in (callbacks[0], callbacks[3], callbacks[4]))
    trained_target = [p.detach().clone() for p in callbacks[0].q1_target.parameters()]

    fresh, fresh_parts = sac_callbacks(hidden=(8,), seed=1)
    assert fresh_parts["ln_alpha"].item() == 0.0
    restorer = CheckpointLoader(callbacks=fresh, run_dir=tmp_path)
    state = Trainer([restorer, *fresh], []).train()
    assert state["bp_step"] == 30
    for holder in (fresh[0], fresh[3], fresh[4]):
        assert holder.ln_alpha is fresh_parts["ln_alpha"]
        assert holder.ln_alpha.item() == pytest.approx(trained_alpha)
    for saved, restored in zip(trained_target, fresh[0].q1_target.parameters(), strict=True):
        torch.testing.assert_close(saved, restored)
    torch.testing.assert_close(
        fresh_parts["policy"].act(torch.ones(1, 1)), parts["policy"].act(torch.ones(1, 1))
    )


def test_alpha_loss_checks_its_inputs() -> None:
    policy = GaussianMlpPolicy(observation_dim=1, action_dim=1, hidden_dims=(8,))
    ln_alpha = torch.zeros(1, requires_grad=True)
    with pytest.raises(ConfigurationError, match="optimizer does not hold ln_alpha"):
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=1,
                  optimizer=torch.optim.Adam(policy.parameters()))  # fmt: skip
    with pytest.raises(ConfigurationError, match="leaf tensor"):
        AlphaLoss(policy=policy, ln_alpha=ln_alpha * 1, action_dim=1,
                  optimizer=torch.optim.Adam([ln_alpha]))  # fmt: skip


def test_a_batch_without_q_target_names_the_missing_key() -> None:
    callbacks, _ = sac_callbacks(hidden=(8,))
    loader = MemoryLoader(table=bandit_table(episodes=20), rollout_count=8, rollout_length=1)
    with pytest.raises(MissingStateKeyError, match="q_target"):
        Trainer([callbacks[1], BackPropStepsTerminator(bp_steps=2)], loader).train()


def test_the_temperature_step_reuses_the_policy_losss_samples_of_the_same_step() -> None:
    callbacks, parts = sac_callbacks(hidden=(8,))
    policy, policy_loss, alpha_loss = parts["policy"], callbacks[3], callbacks[4]
    calls = []
    original = policy.sample
    policy.sample = lambda observation, epsilon=None: calls.append(1) or original(observation)
    batch = bandit_table(episodes=20).sample(16, 1)
    state = {**batch, "bp_step": 5}
    state.update(policy_loss.backward(**state)["default"])
    assert state["policy_log_probs"].shape == (16, 1) and state["policy_log_probs_step"] == 5
    alpha_loss.backward(**state)
    assert len(calls) == 1  # the policy ran once, for both losses
    alpha_loss.backward(**{**state, "bp_step": 6})  # stale samples are not reused
    assert len(calls) == 2
    expected = -(parts["ln_alpha"] * (state["policy_log_probs"] - 1.0)).mean()
    value = alpha_loss.loss(**state)
    torch.testing.assert_close(value, expected)


def test_losses_sample_the_policy_even_when_a_collector_left_it_in_eval_mode() -> None:
    callbacks, parts = sac_callbacks(hidden=(8,))
    batch = bandit_table(episodes=20).sample(16, 1)
    arguments = (batch["next_observation"], batch["rewards"], batch["masks"])
    torch.manual_seed(3)
    training = callbacks[0].begin_batch(*arguments)["default"]["q_target"]
    parts["policy"].eval()
    torch.manual_seed(3)
    evaluating = callbacks[0].begin_batch(*arguments)["default"]["q_target"]
    torch.testing.assert_close(training, evaluating)


def test_n_step_sac_trains_through_the_trainer() -> None:
    table = DictObsNStepMemoryTable(spaces=SPACES, maxlen=1000, seed=0)
    rng = np.random.default_rng(0)
    for identity in range(10):
        actions = rng.uniform(-1, 1, size=5)
        add_episode(
            table, identity, rng.normal(size=6), actions, -np.abs(actions), EpisodeState.INTERRUPTED
        )
    callbacks, parts = sac_callbacks(hidden=(8,))
    callbacks[0] = QTarget(
        policy=parts["policy"], ln_alpha=parts["ln_alpha"], q1=parts["q1"], q2=parts["q2"],
        q1_target=copy.deepcopy(parts["q1"]), q2_target=copy.deepcopy(parts["q2"]),
        rollout_length=3,
    )  # fmt: skip
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=3)
    state = Trainer([*callbacks, BackPropStepsTerminator(bp_steps=5)], loader).train()
    assert state["default"]["q_target"].shape == (4, 1)
    assert state["default"]["policy_log_probs"].shape == (12, 1)
    assert np.isfinite(callbacks[1].scalar_logs["loss/q1"])


def alpha_loss(**kwargs) -> AlphaLoss:
    policy = GaussianMlpPolicy(observation_dim=1, action_dim=2, hidden_dims=(8,))
    ln_alpha = torch.zeros(1, requires_grad=True)
    return AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=2,
                     optimizer=torch.optim.Adam([ln_alpha]), **kwargs)  # fmt: skip


def test_alpha_loads_upstreams_layout_in_place_and_refuses_a_state_without_alpha() -> None:
    loss = alpha_loss()
    shared = loss.ln_alpha
    loss.load_state_dict({"network_state_dict": torch.tensor(1.5)}, load_optimizer=False)
    assert loss.ln_alpha is shared and shared.item() == 1.5
    with pytest.raises(CheckpointError, match="no ln_alpha to load"):
        loss.load_state_dict({"optimizer_state_dict": None}, load_optimizer=False)
    loss.load_state_dict({}, load_network=False, load_optimizer=False)  # nothing asked for
    assert shared.item() == 1.5


def test_a_number_target_entropy_is_a_constant_schedule_that_does_not_block_capture() -> None:
    default, numbered = alpha_loss(), alpha_loss(target_entropy=-0.5)
    assert isinstance(default.target_entropy, ConstantSchedule)
    assert default.target_entropy.value == -2.0 and numbered.target_entropy_value == -0.5
    assert default.capture_blocker() is None
    scheduled = alpha_loss(target_entropy=LinearSchedule(0.0, -1.0, 2))
    assert scheduled.capture_blocker() == "its target entropy follows a schedule"
    with pytest.raises(TypeError, match="target_entropy must be a number"):
        alpha_loss(target_entropy="auto")
