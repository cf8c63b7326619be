"""Discrete action masks: spaces that carry them, DQN's acting and targets that honour them."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces as gym_spaces
from torch import nn

from emote_core.algorithms.dqn import QTarget
from emote_core.algorithms.dqn.family import DoubleDQN, DqnConfig, DqnCritic
from emote_core.algorithms.registry import BuildContext
from emote_core.env import DictGymWrapper, MaskedGrid, make_vector_env
from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.onnx.graph import masked_argmax
from emote_core.proxies import EpsilonGreedyAgentProxy, RandomAgentProxy
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.typing import DictObservation, EpisodeState

N = 5
MASKED_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=DiscreteSpace(n=N),
    state=DictSpace(
        {
            "obs": BoxSpace(np.float32, (1,)),
            "action_mask": BoxSpace(np.int8, (N,), low=np.zeros(N), high=np.ones(N)),
        }
    ),
)


class ScaledValues(nn.Module):
    """``Q(s) = s * w``: one value per action, easy to work out by hand."""

    def __init__(self, weights: list[float]) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.tensor([weights]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation * self.weights


class ConstantValues(nn.Module):
    """The same values for every observation."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = nn.Parameter(torch.tensor([values]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.values.expand(observation.shape[0], -1)


# The best action is 0, then 1, ...: an agent that ignores masks always takes 0.
PREFERS_LOW = [5.0, 4.0, 3.0, 2.0, 1.0]


def random_masks(rng: np.random.Generator, rows: int) -> np.ndarray:
    """0/1 int8 masks allowing at least one action per row, the first action mostly masked."""
    masks = (rng.random((rows, N)) < 0.5).astype(np.int8)
    masks[:, 0] = rng.random(rows) < 0.1
    masks[np.arange(rows), rng.integers(0, N, rows)] = 1
    return masks


def proxy(epsilon: float, seed: int = 0) -> EpsilonGreedyAgentProxy:
    return EpsilonGreedyAgentProxy(
        q_network=ScaledValues(PREFERS_LOW), device="cpu", num_actions=N, epsilon=epsilon,
        input_key="obs", seed=seed, action_mask_key="action_mask",
    )  # fmt: skip


def observations(masks: np.ndarray) -> dict[int, DictObservation]:
    return {
        agent: DictObservation(
            episode_state=EpisodeState.RUNNING,
            array_data={"obs": np.ones(1, np.float32), "action_mask": mask},
            rewards={},
        )
        for agent, mask in enumerate(masks)
    }


def test_spaces_take_an_action_mask_and_refuse_one_that_does_not_fit() -> None:
    features = gym_spaces.Box(-1.0, 1.0, (3,), np.float32)
    for mask in (gym_spaces.MultiBinary(4), gym_spaces.Box(0, 1, (4,), np.int8)):
        spaces = MDPSpace.from_gymnasium(
            gym_spaces.Dict({"obs": features, "action_mask": mask}), gym_spaces.Discrete(4)
        )
        assert spaces.action_mask_key == "action_mask" and spaces.feature_keys == ["obs"]
        assert spaces.state["action_mask"].shape == (4,)
        assert spaces.state["action_mask"].dtype == np.int8
    plain = MDPSpace.from_gymnasium(features, gym_spaces.Discrete(4))
    assert plain.action_mask_key is None and plain.feature_keys == ["obs"]

    refused = [
        (gym_spaces.MultiBinary(3), gym_spaces.Discrete(4), r"shape \(3,\).*shape \(4,\)"),
        (gym_spaces.MultiBinary((2, 2)), gym_spaces.Discrete(4), r"shape \(2, 2\)"),
        (gym_spaces.Box(0, 5, (4,), np.int8), gym_spaces.Discrete(4), "MultiBinary"),
        (gym_spaces.Box(0.0, 1.0, (4,), np.float32), gym_spaces.Discrete(4), "MultiBinary"),
        (gym_spaces.MultiBinary(2), gym_spaces.Box(-1, 1, (2,)), "continuous|masks discrete"),
    ]
    for mask, actions, message in refused:
        observation = gym_spaces.Dict({"obs": features, "action_mask": mask})
        with pytest.raises(ConfigurationError, match=message) as caught:
            MDPSpace.from_gymnasium(observation, actions)
        assert "\n" not in str(caught.value)


def test_the_masked_grid_hands_dqn_its_mask_but_not_as_a_network_input() -> None:
    env = DictGymWrapper(make_vector_env("emote/MaskedGrid-v0", num_envs=2))
    try:
        spaces = env.spaces
        first = env.reset(seed=3)
    finally:
        env.close()
    assert sorted(spaces.state.keys()) == ["action_mask", "obs"]
    for observation in first.values():
        assert observation.array_data["action_mask"].dtype == np.int8
        assert observation.array_data["action_mask"].shape == (4,)
    family = DoubleDQN()
    family.check_spaces(spaces, env_id="emote/MaskedGrid-v0")
    context = BuildContext(spaces=spaces, device=torch.device("cpu"), seed=0, env_id="grid")
    networks = family.make_networks(DqnConfig(hidden_dims=[8]), context)
    assert networks.q(torch.zeros(3, 2)).shape == (3, 4)  # reads obs (2 numbers) only

    two_features = MDPSpace(
        rewards=spaces.rewards, actions=spaces.actions,
        state=DictSpace({**spaces.state.spaces, "extra": BoxSpace(np.float32, (1,))}),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="one observation key"):
        family.check_spaces(two_features, env_id="grid")
    wrong = MDPSpace(
        rewards=spaces.rewards, actions=DiscreteSpace(n=3), state=spaces.state
    )  # a stored space that escaped the gymnasium check
    with pytest.raises(ConfigurationError, match=r"shape \(4,\) for 3 discrete actions"):
        family.check_spaces(wrong, env_id="grid")


@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0])
def test_acting_never_picks_a_masked_action(epsilon: float) -> None:
    rng = np.random.default_rng(7)
    agent = proxy(epsilon)
    chosen = np.zeros(N, dtype=np.int64)
    for _ in range(40):
        masks = random_masks(rng, 25)
        responses = agent(observations(masks))
        actions = np.array([int(responses[a].list_data["actions"][0]) for a in range(25)])
        batch = agent.act_batch({"obs": np.ones((25, 1), np.float32), "action_mask": masks})
        for picked in (actions, batch[:, 0]):
            assert np.all(masks[np.arange(25), picked] == 1)
            np.add.at(chosen, picked, 1)
        if epsilon == 0.0:  # greedy: the best allowed, the lowest index here
            assert np.array_equal(actions, masks.argmax(axis=1))
    if epsilon == 1.0:  # exploring: every action gets picked where allowed
        assert np.all(chosen > 0)


def test_a_fully_masked_step_or_a_mask_of_another_shape_is_one_line() -> None:
    agent = proxy(0.5)
    masks = np.ones((3, N), np.int8)
    masks[1] = 0
    with pytest.raises(ConfigurationError, match=r"agent 1.*allows none of the 5") as caught:
        agent(observations(masks))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigurationError, match="row 1 allows none"):
        agent.act_batch({"obs": np.ones((3, 1), np.float32), "action_mask": masks})
    with pytest.raises(ConfigurationError, match=r"shape \(5,\)"):
        agent(observations(np.ones((2, N - 1), np.int8)))
    with pytest.raises(ConfigurationError, match="'action_mask'"):
        agent.act_batch({"obs": np.ones((3, 1), np.float32)})


def masked_batch() -> dict:
    """Two one-step episodes: s' = 2 with actions {1, 3} allowed, then s' = 2 with none."""
    table = DictObsMemoryTable(spaces=MASKED_SPACES, maxlen=100)
    next_masks = [np.array([0, 1, 0, 1, 0], np.int8), np.zeros(N, np.int8)]
    for identity, (next_mask, end) in enumerate(
        zip(next_masks, [EpisodeState.INTERRUPTED, EpisodeState.INTERRUPTED], strict=True)
    ):
        table.add_sequence(
            identity,
            {
                "obs": np.array([[1.0], [2.0]], np.float32),
                "action_mask": np.stack([np.ones(N, np.int8), next_mask]),
                "actions": np.array([[0]], np.int64),
                "rewards": np.array([[1.0]], np.float32),
            },
            end_state=end,
        )
    return table.sample_all()


@pytest.mark.parametrize("double_dqn", [True, False])
def test_targets_ignore_the_actions_the_next_mask_forbids(double_dqn: bool) -> None:
    # Q(s') = 2 * [5, 4, 3, 2, 1]: the best action 0 is masked, so the best allowed is 1 (Q 8);
    # the second episode's s' allows nothing: no future value, as after TERMINAL.
    q = ScaledValues(PREFERS_LOW)
    target = QTarget(
        q=q, q_target_network=copy.deepcopy(q), gamma=0.5, target_update_interval=10,
        double_dqn=double_dqn, observation_keys=["obs"], action_mask_key="action_mask",
    )  # fmt: skip
    batch = masked_batch()
    result = target.begin_batch(
        next_observation=batch["next_observation"], rewards=batch["rewards"], masks=batch["masks"]
    )["default"]["q_target"]
    assert torch.allclose(result, torch.tensor([[1.0 + 0.5 * 8.0], [1.0]]))
    unmasked = QTarget(
        q=q, q_target_network=copy.deepcopy(q), gamma=0.5, target_update_interval=10,
        double_dqn=double_dqn, observation_keys=["obs"],
    )  # fmt: skip
    ignoring = unmasked.begin_batch(
        next_observation=batch["next_observation"], rewards=batch["rewards"], masks=batch["masks"]
    )["default"]["q_target"]
    assert torch.allclose(ignoring, torch.tensor([[1.0 + 0.5 * 10.0], [1.0 + 0.5 * 10.0]]))


@pytest.mark.parametrize("critic", [DqnCritic.HUBER, DqnCritic.HL_GAUSS])
def test_the_dqn_family_wires_the_mask_into_targets_losses_and_acting(critic: DqnCritic) -> None:
    family = DoubleDQN()
    context = BuildContext(
        spaces=MASKED_SPACES, device=torch.device("cpu"), seed=0, env_id="masked"
    )
    config = DqnConfig(hidden_dims=[8], critic=critic)
    networks = family.make_networks(config, context)
    parts = family.training_parts(config, networks, context)
    q_target = next(c for c in parts.callbacks if isinstance(c, QTarget))
    assert q_target.action_mask_key == "action_mask" and q_target.observation_keys == ["obs"]
    loss = next(c for c in parts.callbacks if getattr(c, "name", "") == "q")
    assert loss.observation_keys == ["obs"]
    batch = masked_batch()
    values = q_target.begin_batch(
        next_observation=batch["next_observation"], rewards=batch["rewards"], masks=batch["masks"]
    )["default"]["q_target"]
    with torch.no_grad():
        next_values = networks.targets["q"](batch["next_observation"]["obs"])[0]
        best = networks.q(batch["next_observation"]["obs"])[0]
    allowed = torch.tensor([1, 3])
    chosen = allowed[best[allowed].argmax()]
    expected = 1.0 + config.gamma * next_values[chosen]
    assert torch.allclose(values[0, 0], expected) and values[1, 0] == 1.0
    assert torch.isfinite(loss.loss(
        observation=batch["observation"], actions=batch["actions"], q_target=values
    ))  # fmt: skip
    agent = family.acting_agent(config, networks, context, deterministic=True)
    masks = random_masks(np.random.default_rng(1), 50)
    picked = agent.act_batch({"obs": np.ones((50, 1), np.float32), "action_mask": masks})
    assert np.all(masks[np.arange(50), picked[:, 0]] == 1)


def test_masked_argmax_picks_the_best_allowed_for_float_and_integer_masks() -> None:
    values = torch.tensor([[3.0, 1.0, 2.0], [-1e30, -5.0, -1e30]])
    for masks in (torch.tensor([[0, 1, 1], [1, 0, 1]]), torch.tensor([[0.0, 1.0, 1.0], [1, 0, 1]])):
        assert masked_argmax(values, masks).tolist() == [[2], [0]]


def test_an_agent_that_honours_the_grid_mask_scores_better_than_one_that_ignores_it() -> None:
    # The same greedy Q (down, then right, ...) with and without the mask, on the same walls.
    def mean_return(mask_key: str | None) -> float:
        env = DictGymWrapper(make_vector_env("emote/MaskedGrid-v0", num_envs=4))
        agent = EpsilonGreedyAgentProxy(
            q_network=ConstantValues([1.0, 4.0, 2.0, 3.0]), device="cpu", num_actions=4,
            epsilon=0.0, input_key="obs", action_mask_key=mask_key,
        )  # fmt: skip
        observations = env.reset(seed=11)
        while len(env.completed_episodes) < 40:
            observations = env.step(agent(observations))
        env.close()
        return float(np.mean([r for r, _ in env.completed_episodes[:40]]))

    honouring, ignoring = mean_return("action_mask"), mean_return(None)
    assert ignoring < -0.9  # it walks into the bottom edge, at the latest, and forfeits
    assert honouring > ignoring + 0.5
    assert isinstance(MaskedGrid().action_space, gym_spaces.Discrete)


def test_random_actions_are_drawn_among_the_allowed_ones_and_never_ahead() -> None:
    agent = RandomAgentProxy(
        action_space=gym_spaces.Discrete(N), seed=3, action_mask_key="action_mask"
    )
    assert getattr(agent, "act_steps", None) is None  # a collector cannot draw ahead of masks
    rng = np.random.default_rng(5)
    chosen = np.zeros(N, dtype=np.int64)
    for _ in range(20):
        masks = random_masks(rng, 25)
        responses = agent(observations(masks))
        by_agent = np.array([int(responses[a].list_data["actions"][0]) for a in range(25)])
        batch = agent.act_batch({"obs": np.ones((25, 1), np.float32), "action_mask": masks})
        assert batch.shape == (25, 1) and batch.dtype == np.int64
        for picked in (by_agent, batch[:, 0]):
            assert np.all(masks[np.arange(25), picked] == 1)
            np.add.at(chosen, picked, 1)
    assert np.all(chosen > 0)
    masks = np.ones((2, N), np.int8)
    masks[0] = 0
    with pytest.raises(ConfigurationError, match="agent 0 allows none"):
        agent(observations(masks))
    with pytest.raises(ConfigurationError, match="masks discrete actions"):
        RandomAgentProxy(action_space=gym_spaces.Box(-1, 1, (2,)), action_mask_key="action_mask")
    unmasked = RandomAgentProxy(action_space=gym_spaces.Discrete(N), seed=3)
    assert unmasked.act_steps(2, 3).shape == (2, 3, 1)


def test_a_pettingzoo_game_s_action_mask_is_honoured_move_after_move() -> None:
    from pettingzoo.classic import tictactoe_v3

    game = tictactoe_v3.env()
    game.reset(seed=0)
    first = game.agents[0]
    spaces = MDPSpace.from_gymnasium(game.observation_space(first), game.action_space(first))
    assert spaces.action_mask_key == "action_mask" and spaces.feature_keys == ["observation"]
    family = DoubleDQN()
    family.check_spaces(spaces, env_id="tictactoe_v3")
    context = BuildContext(spaces=spaces, device=torch.device("cpu"), seed=0, env_id="ttt")
    config = DqnConfig(hidden_dims=[16], epsilon_end=0.5)
    networks = family.make_networks(config, context)
    agent = family.acting_agent(config, networks, context, deterministic=False)
    moves = 0
    for games in range(5):
        game.reset(seed=games)
        for _player in game.agent_iter():
            observation, _, terminated, truncated, _ = game.last()
            if terminated or truncated:
                game.step(None)
                continue
            step = DictObservation(
                episode_state=EpisodeState.RUNNING, array_data=observation, rewards={}
            )
            action = int(agent({0: step})[0].list_data["actions"][0])
            assert observation["action_mask"][action] == 1
            game.step(action)
            moves += 1
    assert moves >= 25
    game.close()


def test_n_step_targets_read_the_mask_after_each_window() -> None:
    # Two windows of 2 transitions; only the mask after each window's last step counts.
    q = ScaledValues(PREFERS_LOW)
    target = QTarget(
        q=q, q_target_network=copy.deepcopy(q), gamma=0.5, target_update_interval=10,
        rollout_length=2, observation_keys=["obs"], action_mask_key="action_mask",
    )  # fmt: skip
    masks = torch.tensor(
        [[1, 0, 0, 0, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], dtype=torch.int8
    )
    result = target.begin_batch(
        next_observation={"obs": torch.full((4, 1), 2.0), "action_mask": masks},
        rewards=torch.ones(4, 1), masks=torch.ones(4, 1),
    )["default"]["q_target"]  # fmt: skip
    # 1 + 0.5 * 1 + 0.25 * Q(2)[best allowed]: action 2 (Q 6), then action 1 (Q 8).
    assert torch.allclose(result, torch.tensor([[1.5 + 0.25 * 6.0], [1.5 + 0.25 * 8.0]]))
