"""ModelEnv on a model of known dynamics (next = observation + action): how rollouts end, where
rewards come from, and the dict loop with a real agent proxy and a real memory table."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.models import ModelEnv
from emote_core.proxies.generic import GenericAgentProxy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.typing import DictResponse, EpisodeState

INITIAL, RUNNING = EpisodeState.INITIAL, EpisodeState.RUNNING
TERMINAL, INTERRUPTED = EpisodeState.TERMINAL, EpisodeState.INTERRUPTED
THRESHOLD = 3.0


class AddModel:
    """``next = observation + action``; its learned reward is ``-|next|`` summed over a row."""

    def __init__(self, *, learns_rewards: bool = True) -> None:
        self.learns_rewards = learns_rewards
        self.generators: list[torch.Generator | None] = []

    def sample(
        self,
        observation: torch.Tensor,
        action: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.generators.append(generator)
        next_observation = observation + action
        if not self.learns_rewards:
            return next_observation, None
        return next_observation, -next_observation.abs().sum(dim=1, keepdim=True)


def past_threshold(actions: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
    return next_observation[:, :1] >= THRESHOLD


def tenfold_x_plus_action(actions: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
    return 10.0 * next_observation[:, :1] + actions[:, :1]


def env(**overrides: object) -> ModelEnv:
    settings: dict[str, object] = {"model": AddModel(), "termination_fn": past_threshold}
    settings.update(overrides)
    return ModelEnv(**settings)  # type: ignore[arg-type]


# Tensor API.


def test_rollouts_end_interrupted_at_their_length_limit() -> None:
    model_env = env(termination_fn="none")
    start = torch.tensor([[0.0, 0.0], [10.0, 1.0], [-4.0, 2.0]])
    model_env.reset(start, rollout_length=3)
    assert model_env.num_envs == 3
    for step in range(1, 4):
        assert model_env.running.tolist() == [0, 1, 2]
        next_observation, _, terminated, truncated = model_env.step(torch.ones(3, 2))
        torch.testing.assert_close(next_observation, start + step)
        assert not terminated.any()
        assert truncated[:, 0].tolist() == [step == 3] * 3
    assert model_env.running.tolist() == [] and model_env.running_agents == []
    with pytest.raises(ConfigurationError, match=r"all 3 rollouts have ended.*call reset"):
        model_env.step(torch.ones(0, 2))


def test_termination_ends_exactly_the_rows_it_fires_for_and_the_others_go_on() -> None:
    model_env = env()
    # x reaches 3 at step 1 (row 1), step 2 (row 3) and step 3 (row 0); row 2 never does.
    model_env.reset(torch.tensor([[0.0, 0.0], [2.0, 0.0], [-50.0, 0.0], [1.0, 0.0]]), 4)
    expected = [  # (running before the step, terminated rows, truncated rows)
        ([0, 1, 2, 3], [False, True, False, False], [False] * 4),
        ([0, 2, 3], [False, False, True], [False] * 3),
        ([0, 2], [True, False], [False, False]),
        ([2], [False], [True]),
    ]
    for running, terminated_rows, truncated_rows in expected:
        assert model_env.running.tolist() == running
        next_observation, rewards, terminated, truncated = model_env.step(
            torch.ones(len(running), 2)
        )
        assert next_observation.shape == (len(running), 2) and rewards.shape == (len(running), 1)
        assert terminated.dtype == torch.bool and terminated.shape == (len(running), 1)
        assert terminated[:, 0].tolist() == terminated_rows
        assert truncated[:, 0].tolist() == truncated_rows
    assert model_env.running.tolist() == [] and model_env.steps == 4


def test_rewards_come_from_reward_fn_when_given_else_from_the_model() -> None:
    start = torch.tensor([[1.0, -2.0], [0.0, 0.5]])
    actions = torch.tensor([[0.5, 0.0], [-3.0, 1.0]])
    learned = env(termination_fn="none")
    learned.reset(start, 1)
    _, rewards, _, _ = learned.step(actions)
    torch.testing.assert_close(rewards, torch.tensor([[-3.5], [-4.5]]))

    given = env(termination_fn="none", reward_fn=tenfold_x_plus_action)
    given.reset(start, 1)
    _, rewards, _, _ = given.step(actions)
    torch.testing.assert_close(rewards, torch.tensor([[15.5], [-33.0]]))


def test_no_learned_rewards_and_no_reward_fn_is_a_clear_error_at_the_first_step() -> None:
    model_env = env(model=AddModel(learns_rewards=False))
    model_env.reset(torch.zeros(2, 2), 3)
    with pytest.raises(ConfigurationError, match="no reward_fn and the model returned no learned"):
        model_env.step(torch.zeros(2, 2))
    with_fn = env(model=AddModel(learns_rewards=False), reward_fn=tenfold_x_plus_action)
    with_fn.reset(torch.zeros(2, 2), 3)
    assert with_fn.step(torch.ones(2, 2))[1][:, 0].tolist() == [11.0, 11.0]


@pytest.mark.parametrize("rollout_length", [0, -1, 1.5, True, "3"])
def test_rollout_length_must_be_a_positive_integer(rollout_length: object) -> None:
    model_env = env()
    with pytest.raises(ConfigurationError, match="rollout_length must be a positive integer; got"):
        model_env.reset(torch.zeros(2, 2), rollout_length)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="rollout_length must be a positive integer; got"):
        model_env.dict_reset(torch.zeros(2, 2), rollout_length)  # type: ignore[arg-type]


def test_step_needs_one_action_row_per_running_rollout_and_a_reset_first() -> None:
    model_env = env()
    with pytest.raises(ConfigurationError, match="call reset first"):
        model_env.step(torch.zeros(2, 2))
    model_env.reset(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), 5)
    with pytest.raises(ConfigurationError, match=r"a \(2, A\) tensor; got shape \(3, 2\)"):
        model_env.step(torch.zeros(3, 2))
    with pytest.raises(ConfigurationError, match=r"got shape \(2,\)"):
        model_env.step(torch.zeros(2))
    model_env.step(torch.ones(2, 2))  # row 0 terminates
    with pytest.raises(ConfigurationError, match=r"a \(1, A\) tensor; got shape \(2, 2\)"):
        model_env.step(torch.ones(2, 2))


def test_the_generator_reaches_the_model_and_names_resolve_to_registered_functions() -> None:
    generator = torch.Generator().manual_seed(3)
    model = AddModel()
    model_env = env(model=model, generator=generator, termination_fn="pendulum")
    model_env.reset(torch.full((2, 2), 100.0), 1)
    _, _, terminated, _ = model_env.step(torch.zeros(2, 2))
    assert model.generators == [generator] and not terminated.any()
    with pytest.raises(ConfigurationError, match="did you mean 'pendulum'"):
        env(termination_fn="pendulm")


@pytest.mark.parametrize(
    ("termination_fn", "got"),
    [
        (lambda a, o: o[:, :1] > 0, None),
        (lambda a, o: (o[:, 0] > 0).float(), None),  # 0/1 numbers are flags, as upstream read
        (lambda a, o: [True, True], "list"),
        (lambda a, o: o > 0, r"shape \(2, 2\)"),
    ],
)
def test_a_termination_function_must_return_one_flag_per_row(termination_fn, got) -> None:
    model_env = env(termination_fn=termination_fn)
    model_env.reset(torch.zeros(2, 2), 2)
    if got is None:
        assert model_env.step(torch.ones(2, 2))[2].all()
        return
    with pytest.raises(ConfigurationError, match=f"termination_fn must return a bool.*{got}"):
        model_env.step(torch.ones(2, 2))


def test_constructor_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ConfigurationError, match="must have a sample"):
        ModelEnv(model=nn.Linear(2, 2), termination_fn="none")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="termination_fn must be a callable"):
        env(termination_fn=3)
    with pytest.raises(ConfigurationError, match="reward_fn must be None"):
        env(reward_fn="reward")
    with pytest.raises(ConfigurationError, match=r"generator must be a torch\.Generator"):
        env(generator=0)
    with pytest.raises(ConfigurationError, match="input_key must be a non-empty string"):
        env(input_key="")


# Dict API.


def test_dict_reset_reports_initial_float32_rows_under_ids_fresh_across_resets() -> None:
    model_env = env(input_key="state")
    start = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    first = model_env.dict_reset(start.double(), 2)
    second = model_env.dict_reset({"state": start, "other": torch.zeros(2, 5)}, 2)
    assert not set(first) & set(second) and len(first) == len(second) == 2
    assert list(second) == model_env.running_agents
    start.add_(100.0)  # the caller reuses its tensor: the reported rows must be copies
    for observations in (first, second):
        rows = [o.array_data["state"] for o in observations.values()]
        assert all(o.episode_state == INITIAL for o in observations.values())
        assert all(row.dtype == np.float32 for row in rows)
        np.testing.assert_array_equal(np.stack(rows), [[0.0, 1.0], [2.0, 3.0]])
    with pytest.raises(ConfigurationError, match=r"have no 'state' \(they have \['obs'\]\)"):
        model_env.dict_reset({"obs": start}, 2)


def respond(observations, value: float = 1.0) -> dict[int, DictResponse]:
    return {a: DictResponse({"actions": np.full(2, value, np.float32)}) for a in observations}


def test_dict_step_reports_running_terminal_and_interrupted_agents_with_rewards() -> None:
    model_env = env(reward_fn=tenfold_x_plus_action)
    observations = model_env.dict_reset(torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.5, 5.0]]), 2)
    agents = list(observations)
    stepped, info = model_env.dict_step(respond(observations))
    assert [stepped[a].episode_state for a in agents] == [TERMINAL, RUNNING, RUNNING]
    assert [stepped[a].rewards["reward"] for a in agents] == [31.0, 11.0, 26.0]
    np.testing.assert_array_equal(stepped[agents[2]].array_data["obs"], [2.5, 6.0])
    assert info == {"reward": 68 / 3, "terminated": 1.0, "interrupted": 0.0, "running": 2.0}

    running = {a: o for a, o in stepped.items() if a != agents[0]}
    stepped, info = model_env.dict_step(respond(running, value=0.5))
    assert list(stepped) == agents[1:]
    assert [stepped[a].episode_state for a in agents[1:]] == [INTERRUPTED, TERMINAL]
    assert info["terminated"] == info["interrupted"] == 1.0 and info["running"] == 0.0
    with pytest.raises(ConfigurationError, match="rollouts have ended"):
        model_env.dict_step({})


def test_dict_step_refuses_missing_extra_and_action_less_responses() -> None:
    model_env = env()
    observations = model_env.dict_reset(torch.zeros(3, 2), 2)
    agents = list(observations)
    responses = respond(observations)
    with pytest.raises(ConfigurationError, match=rf"1 of 3 have none \(first: \[{agents[1]}\]\)"):
        model_env.dict_step({a: r for a, r in responses.items() if a != agents[1]})
    with pytest.raises(ConfigurationError, match=r"responses for 1 agents that are not running"):
        model_env.dict_step({**responses, 999: responses[agents[0]]})
    with pytest.raises(ConfigurationError, match=r"reads list_data\['actions'\].*\['act'\]"):
        model_env.dict_step({a: DictResponse({"act": np.zeros(2)}) for a in agents})
    assert model_env.running_agents == agents  # nothing was stepped by the refused calls
    stepped, _ = model_env.dict_step(responses)
    assert list(stepped) == agents


# The dict loop into a real memory.


class AffinePolicy(nn.Module):
    """``action = 0.1 * obs + [1, 0]``: x grows by about 1 a step from small positive values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        with torch.no_grad():
            self.linear.weight.copy_(0.1 * torch.eye(2))
            self.linear.bias.copy_(torch.tensor([1.0, 0.0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs)


SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,)),
    state=DictSpace({"obs": BoxSpace(np.float32, (2,))}),
)


def agent_and_memory() -> tuple[GenericAgentProxy, MemoryTableProxy]:
    agent = GenericAgentProxy(
        policy=AffinePolicy(), device="cpu", input_keys=["obs"], output_keys=["actions"]
    )
    return agent, MemoryTableProxy(DictObsMemoryTable(spaces=SPACES, maxlen=1_000, seed=0))


def test_rollout_fills_the_table_with_whole_episodes_of_the_known_dynamics() -> None:
    agent, memory = agent_and_memory()
    model_env = env(reward_fn=tenfold_x_plus_action)
    # x passes 3 after 1, 2 and 3 steps for the first rows; the last one only falls.
    start = torch.tensor([[2.5, 1.0], [1.5, -1.0], [0.0, 0.0], [-20.0, 4.0]])
    summary = model_env.rollout(agent, memory, {"obs": start}, rollout_length=4)

    assert memory.open_episodes == 0 and memory.table.episode_count == 4
    episodes = list(memory.table.episodes())
    by_start = {float(data["obs"][0, 0]): (data, end) for _, data, end in episodes}
    expected = {2.5: (1, TERMINAL), 1.5: (2, TERMINAL), 0.0: (3, TERMINAL), -20.0: (4, INTERRUPTED)}
    rewards = []
    for x0, (length, end_state) in expected.items():
        data, end = by_start[x0]
        assert end == end_state and len(data["rewards"]) == length
        obs, actions = data["obs"].astype(np.float64), data["actions"].astype(np.float64)
        np.testing.assert_allclose(actions, 0.1 * obs[:-1] + [1.0, 0.0], rtol=1e-6)
        np.testing.assert_allclose(obs[1:], obs[:-1] + actions, rtol=1e-6)
        np.testing.assert_allclose(data["rewards"][:, 0], 10 * obs[1:, 0] + actions[:, 0], 1e-5)
        assert (obs[1:-1, 0] < THRESHOLD).all()
        assert (obs[-1, 0] >= THRESHOLD) == (end == TERMINAL)
        rewards.extend(data["rewards"][:, 0])
    assert summary["episodes"] == 4 and summary["transitions"] == 10
    assert summary["terminated"] == 3 and summary["interrupted"] == 1
    assert summary["reward"] == pytest.approx(float(np.mean(rewards)), rel=1e-5)

    batch = memory.table.sample_all()
    observation = batch["observation"]["obs"]
    torch.testing.assert_close(batch["next_observation"]["obs"], observation + batch["actions"])
    last = batch["dones"][:, 0] == 1
    assert int(last.sum()) == 4
    # Masks are 0 only on the last transition of the TERMINAL episodes.
    ends_past_threshold = batch["next_observation"]["obs"][:, 0] >= THRESHOLD
    assert batch["masks"][:, 0].tolist() == (~(last & ends_past_threshold)).float().tolist()
    assert batch["masks"][:, 0].sum() == 10 - 3


def test_length_one_rollouts_twice_into_one_memory_are_separate_episodes() -> None:
    agent, memory = agent_and_memory()
    model_env = env(reward_fn=tenfold_x_plus_action)
    start = torch.tensor([[2.5, 0.0], [0.0, 0.0], [-1.0, 0.0]])
    first = model_env.rollout(agent, memory, start, rollout_length=1)
    second = model_env.rollout(agent, memory, start, rollout_length=1)
    assert first == second
    assert first["terminated"] == 1 and first["interrupted"] == 2 and first["transitions"] == 3
    episodes = list(memory.table.episodes())
    assert len(episodes) == 6 and memory.open_episodes == 0
    assert [end for _, _, end in episodes] == [TERMINAL, INTERRUPTED, INTERRUPTED] * 2
    assert all(len(data["rewards"]) == 1 for _, data, _ in episodes)
    masks = memory.table.sample_all()["masks"][:, 0].tolist()
    assert masks == [0.0, 1.0, 1.0] * 2


@pytest.mark.gpu
def test_rollouts_on_cuda_reach_the_memory_as_on_the_cpu() -> None:
    agent = GenericAgentProxy(
        policy=AffinePolicy().to("cuda"), device="cuda", input_keys=["obs"], output_keys=["actions"]
    )
    memory = MemoryTableProxy(DictObsMemoryTable(spaces=SPACES, maxlen=1_000, seed=0))
    model_env = env(reward_fn=tenfold_x_plus_action, device="cuda")
    start = torch.tensor([[2.5, 1.0], [-20.0, 4.0]])  # on the cpu: reset moves it
    summary = model_env.rollout(agent, memory, start, rollout_length=3)
    assert model_env.running.device.type == "cuda"
    assert summary["terminated"] == 1 and summary["interrupted"] == 1
    assert summary["transitions"] == 4 and memory.table.episode_count == 2
    batch = memory.table.sample_all()
    observation = batch["observation"]["obs"]
    torch.testing.assert_close(batch["next_observation"]["obs"], observation + batch["actions"])
