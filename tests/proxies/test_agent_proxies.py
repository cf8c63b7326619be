"""Agent proxies: batching across agents, eval-mode inference, noise, validation, exploration."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from emote_core.env import DictGymWrapper, make_vector_env
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import MemoryProxy as MemoryProxyFromMemory
from emote_core.nn.inputs import flatten_observation
from emote_core.proxies import (
    AgentProxy,
    EpsilonGreedyAgentProxy,
    FeatureAgentProxy,
    GenericAgentProxy,
    MemoryProxy,
    MultiKeyAgentProxy,
    RandomAgentProxy,
    VisionAgentProxy,
)
from emote_core.proxies.generic import LogProbsDroppedWarning
from emote_core.schedules import LinearSchedule
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.typing import DictObservation, EpisodeState


def observation(state: EpisodeState, **arrays) -> DictObservation:
    rewards = {} if state == EpisodeState.INITIAL else {"reward": 0.0}
    return DictObservation(
        episode_state=state,
        array_data={k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()},
        rewards=rewards,
    )


def box_spaces(obs_shapes: dict[str, tuple[int, ...]], action_dim: int = 2) -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (action_dim,), low=-1.0, high=1.0),
        state=DictSpace({k: BoxSpace(np.float32, s) for k, s in obs_shapes.items()}),
    )


class TinyGaussianPolicy(nn.Module):
    """Honours GaussianMlpPolicy's contract: train mode -> (actions, log_probs); eval mode takes
    epsilon and returns tanh(mean + std * epsilon)."""

    def __init__(self, observation_dim: int = 3, action_dim: int = 2) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.mean = nn.Linear(observation_dim, action_dim)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.calls: list[tuple[bool, bool, tuple[int, ...]]] = []

    def forward(self, obs: torch.Tensor, epsilon: torch.Tensor | None = None):
        self.calls.append((self.training, torch.is_grad_enabled(), tuple(obs.shape)))
        mean = self.mean(obs)
        if self.training:
            noise = torch.randn_like(mean)
            return torch.tanh(mean + self.log_std.exp() * noise), mean.sum(-1, keepdim=True)
        return torch.tanh(mean + self.log_std.exp() * epsilon)


class Doubler(nn.Module):
    """Returns twice its input: shows which row went to which agent."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs * 2


def test_protocols_are_met_and_memory_proxy_is_the_memory_modules() -> None:
    assert MemoryProxy is MemoryProxyFromMemory
    proxy = FeatureAgentProxy(policy=Doubler(), device="cpu")
    assert isinstance(proxy, AgentProxy)
    assert isinstance(RandomAgentProxy(action_space=gym.spaces.Discrete(3)), AgentProxy)
    assert proxy.input_names == ("obs",) and proxy.output_names == ("actions",)


def test_one_batched_call_answers_every_acting_agent_and_skips_final_ones() -> None:
    policy = TinyGaussianPolicy()
    calls: list[tuple[int, ...]] = []
    policy.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    proxy = FeatureAgentProxy(policy=policy, device="cpu", deterministic=True)
    observations = {
        10: observation(EpisodeState.INITIAL, obs=[1, 0, 0]),
        11: observation(EpisodeState.RUNNING, obs=[0, 1, 0]),
        12: observation(EpisodeState.TERMINAL, obs=[0, 0, 1]),
        13: observation(EpisodeState.INTERRUPTED, obs=[1, 1, 1]),
        14: observation(EpisodeState.RUNNING, obs=[0, 0, 1]),
    }
    responses = proxy(observations)
    assert sorted(responses) == [10, 11, 14]
    assert calls == [(3, 3)]
    with torch.no_grad():
        for agent in (10, 11, 14):
            obs = torch.as_tensor(observations[agent].array_data["obs"])
            expected = torch.tanh(policy.mean(obs)).numpy()
            np.testing.assert_allclose(responses[agent].list_data["actions"], expected, rtol=1e-6)
    assert proxy({12: observations[12]}) == {}
    assert len(calls) == 1  # no policy call when nobody acts


def test_inference_runs_in_eval_mode_without_gradients_and_restores_train_mode() -> None:
    policy = TinyGaussianPolicy()
    policy.train()
    proxy = FeatureAgentProxy(policy=policy, device=torch.device("cpu"))
    proxy({0: observation(EpisodeState.INITIAL, obs=[0.1, 0.2, 0.3])})
    assert policy.calls == [(False, False, (1, 3))]
    assert policy.training  # the trainer's network is left as it was
    policy.eval()
    proxy({0: observation(EpisodeState.RUNNING, obs=[0.1, 0.2, 0.3])})
    assert not policy.training


def test_a_network_already_in_eval_mode_acts_as_it_is_without_a_walk_over_its_modules() -> None:
    class CountsModeSwitches(TinyGaussianPolicy):
        switches = 0

        def train(self, mode: bool = True):
            CountsModeSwitches.switches += 1
            return super().train(mode)

    policy = CountsModeSwitches()
    policy.eval()
    switched = CountsModeSwitches.switches
    proxy = FeatureAgentProxy(policy=policy, device=torch.device("cpu"))
    proxy({0: observation(EpisodeState.INITIAL, obs=[0.1, 0.2, 0.3])})
    proxy.act_batch({"obs": np.zeros((4, 3), np.float32)})
    assert CountsModeSwitches.switches == switched and not policy.training
    assert policy.calls[-1][:2] == (False, False)  # eval mode, no gradients
    policy.train()
    proxy({0: observation(EpisodeState.RUNNING, obs=[0.1, 0.2, 0.3])})
    assert policy.calls[-1][:2] == (False, False) and policy.training


def test_deterministic_acts_with_zero_noise_and_stochastic_with_seeded_normal_noise() -> None:
    torch.manual_seed(0)
    policy = TinyGaussianPolicy(observation_dim=3, action_dim=2)
    obs = {i: observation(EpisodeState.RUNNING, obs=[0.3, -0.2, 0.1]) for i in range(500)}

    def actions(proxy) -> np.ndarray:
        return np.stack([r.list_data["actions"] for r in proxy(obs).values()])

    deterministic = actions(FeatureAgentProxy(policy=policy, device="cpu", deterministic=True))
    assert np.ptp(deterministic, axis=0).max() == 0.0
    first = actions(FeatureAgentProxy(policy=policy, device="cpu", seed=3))
    again = actions(FeatureAgentProxy(policy=policy, device="cpu", seed=3))
    other = actions(FeatureAgentProxy(policy=policy, device="cpu", seed=4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # std is 1: the pre-tanh noise is standard normal around the deterministic action.
    pre_tanh = np.arctanh(np.clip(first, -0.999999, 0.999999)) - np.arctanh(deterministic)
    assert abs(pre_tanh.mean()) < 0.15
    assert 0.85 < pre_tanh.std() < 1.15


def test_noise_shape_comes_from_spaces_or_action_dim_else_a_clear_error() -> None:
    class NoDim(nn.Module):
        def forward(self, obs, epsilon):
            return obs[:, :1] + epsilon

    with pytest.raises(ConfigurationError, match=r"epsilon.*spaces"):
        FeatureAgentProxy(policy=NoDim(), device="cpu")
    spaces = box_spaces({"obs": (3,)}, action_dim=1)
    proxy = FeatureAgentProxy(policy=NoDim(), device="cpu", spaces=spaces, deterministic=True)
    response = proxy({0: observation(EpisodeState.INITIAL, obs=[5, 0, 0])})
    np.testing.assert_array_equal(response[0].list_data["actions"], [5.0])


def test_observations_are_validated_against_the_spaces() -> None:
    spaces = box_spaces({"obs": (3,)})
    proxy = FeatureAgentProxy(policy=TinyGaussianPolicy(), device="cpu", spaces=spaces)
    with pytest.raises(ConfigurationError, match=r"'obs' of agent 7 has shape \(4,\).*\(3,\)"):
        proxy({7: observation(EpisodeState.INITIAL, obs=[1, 2, 3, 4])})
    with pytest.raises(ConfigurationError, match=r"agent 8 has no 'obs'.*'pixels'"):
        proxy({8: observation(EpisodeState.INITIAL, pixels=[1, 2, 3])})
    with pytest.raises(ConfigurationError, match=r"input keys \['speed'\] are not in"):
        FeatureAgentProxy(policy=Doubler(), device="cpu", input_key="speed", spaces=spaces)
    with pytest.raises(ConfigurationError, match="not the string"):
        GenericAgentProxy(policy=Doubler(), device="cpu", input_keys="obs", output_keys=["a"])


def test_generic_proxy_with_several_inputs_and_outputs() -> None:
    class TwoHeads(nn.Module):
        def forward(self, position, goal):
            return goal - position, (goal - position).norm(dim=-1)

    proxy = GenericAgentProxy(
        policy=TwoHeads(),
        device="cpu",
        input_keys=["position", "goal"],
        output_keys=["actions", "distance"],
        spaces=box_spaces({"position": (2,), "goal": (2,)}),
    )
    responses = proxy(
        {
            1: observation(EpisodeState.INITIAL, position=[0, 0], goal=[3, 4]),
            2: observation(EpisodeState.RUNNING, position=[1, 1], goal=[1, 2]),
        }
    )
    np.testing.assert_allclose(responses[1].list_data["actions"], [3, 4])
    np.testing.assert_allclose(responses[1].list_data["distance"], [5.0])
    np.testing.assert_allclose(responses[2].list_data["actions"], [0, 1])
    assert responses[2].list_data["actions"].dtype == np.float32
    wrong = GenericAgentProxy(
        policy=TwoHeads(), device="cpu", input_keys=["position", "goal"], output_keys=["actions"]
    )
    with pytest.warns(LogProbsDroppedWarning, match=r"2 outputs.*second .* dropped"):
        responses = wrong({1: observation(EpisodeState.INITIAL, position=[0, 0], goal=[3, 4])})
    (only,) = responses.values()
    assert list(only.list_data) == ["actions"]  # one output too many: upstream's reading, loudly


def test_discrete_action_spaces_get_int64_actions_of_shape_one() -> None:
    class Chooser(nn.Module):
        def forward(self, obs):
            return obs[:, 0]

    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=DiscreteSpace(n=3),
        state=DictSpace({"obs": BoxSpace(np.float32, (2,))}),
    )
    proxy = FeatureAgentProxy(policy=Chooser(), device="cpu", spaces=spaces)
    action = proxy({0: observation(EpisodeState.INITIAL, obs=[2, 0])})[0].list_data["actions"]
    assert action.dtype == np.int64 and action.shape == (1,) and action[0] == 2
    values = FeatureAgentProxy(policy=Doubler(), device="cpu", spaces=spaces)
    with pytest.raises(ConfigurationError, match="EpsilonGreedyAgentProxy"):
        values({0: observation(EpisodeState.INITIAL, obs=[2, 0])})


def test_multi_key_proxy_concatenates_like_flatten_observation() -> None:
    seen = []

    class Record(nn.Module):
        def forward(self, features):
            seen.append(features.clone())
            return features[:, :2]

    obs = {
        0: observation(EpisodeState.INITIAL, a=[1, 2], b=[[3, 4], [5, 6]]),
        1: observation(EpisodeState.RUNNING, a=[7, 8], b=[[9, 10], [11, 12]]),
    }
    proxy = MultiKeyAgentProxy(policy=Record(), device="cpu", input_keys=["b", "a"])
    proxy(obs)
    batches = {k: torch.tensor(np.stack([o.array_data[k] for o in obs.values()])) for k in "ab"}
    torch.testing.assert_close(seen[0], flatten_observation(batches, ["b", "a"]))
    assert seen[0][0].tolist() == [3, 4, 5, 6, 1, 2]


def test_vision_proxy_adds_channels_moves_them_first_and_scales() -> None:
    seen = []

    class Record(nn.Module):
        def forward(self, images):
            seen.append(images)
            return images.flatten(1)[:, :1]

    frame = np.zeros((6, 5, 3), np.uint8)
    frame[..., 2] = 255
    obs = {0: DictObservation(episode_state=EpisodeState.INITIAL, array_data={"obs": frame})}
    VisionAgentProxy(policy=Record(), device="cpu", channels_first=True, scale=1 / 255)(obs)
    assert seen[-1].shape == (1, 3, 6, 5) and seen[-1].dtype == torch.float32
    assert seen[-1][0, 2].eq(1.0).all() and seen[-1][0, :2].eq(0.0).all()
    gray = {
        0: DictObservation(
            episode_state=EpisodeState.INITIAL, array_data={"obs": np.ones((6, 5), np.uint8)}
        )
    }
    VisionAgentProxy(policy=Record(), device="cpu")(gray)
    assert seen[-1].shape == (1, 6, 5, 1)
    with pytest.raises(ConfigurationError, match="scale must be positive"):
        VisionAgentProxy(policy=Record(), device="cpu", scale=0)


class FavoursTwo(nn.Module):
    def forward(self, obs):
        values = torch.zeros(obs.shape[0], 4, device=obs.device)
        values[:, 2] = 1.0
        return values


def greedy_share(proxy: EpsilonGreedyAgentProxy, agents: int = 4000) -> np.ndarray:
    obs = {i: observation(EpisodeState.RUNNING, obs=[0.0]) for i in range(agents)}
    actions = np.array([r.list_data["actions"] for r in proxy(obs).values()])
    assert actions.dtype == np.int64 and actions.shape == (agents, 1)
    return np.bincount(actions[:, 0], minlength=4) / agents


def test_epsilon_greedy_frequencies_follow_epsilon() -> None:
    def make(epsilon):
        return EpsilonGreedyAgentProxy(
            q_network=FavoursTwo(), device="cpu", num_actions=4, epsilon=epsilon, seed=0
        )

    np.testing.assert_array_equal(greedy_share(make(0.0)), [0, 0, 1, 0])
    uniform = greedy_share(make(1.0))
    assert np.all(np.abs(uniform - 0.25) < 0.03)
    mixed = greedy_share(make(0.4))
    assert abs(mixed[2] - (0.6 + 0.4 / 4)) < 0.03
    assert np.all(np.abs(mixed[[0, 1, 3]] - 0.1) < 0.03)


def test_epsilon_greedy_reads_a_schedule_at_every_call() -> None:
    schedule = LinearSchedule(1.0, 0.0, 10)
    proxy = EpsilonGreedyAgentProxy(
        q_network=FavoursTwo(), device="cpu", num_actions=4, epsilon=schedule, seed=1
    )
    assert greedy_share(proxy)[2] < 0.4
    for _ in range(10):
        schedule.step()
    np.testing.assert_array_equal(greedy_share(proxy), [0, 0, 1, 0])
    assert proxy.policy is proxy.q_network


def test_epsilon_greedy_rejects_bad_settings() -> None:
    with pytest.raises(ConfigurationError, match="probability"):
        EpsilonGreedyAgentProxy(q_network=FavoursTwo(), device="cpu", num_actions=4, epsilon=1.5)
    proxy = EpsilonGreedyAgentProxy(q_network=FavoursTwo(), device="cpu", num_actions=3, epsilon=0)
    with pytest.raises(ConfigurationError, match=r"shape \(1, 4\).*\(1, 3\)"):
        proxy({0: observation(EpisodeState.INITIAL, obs=[0.0])})


def test_random_proxy_respects_the_wrappers_rescaled_box_and_discrete_spaces() -> None:
    pendulum = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=3))
    proxy = RandomAgentProxy(action_space=pendulum.single_action_space, seed=0)
    observations = pendulum.reset(seed=0)
    drawn = []
    for _ in range(200):
        responses = proxy(observations)
        assert sorted(responses) == sorted(
            a for a, o in observations.items() if not o.episode_state.is_final
        )
        drawn += [r.list_data["actions"] for r in responses.values()]
        observations = pendulum.step(responses)
    drawn = np.array(drawn)
    assert drawn.shape == (600, 1) and drawn.dtype == np.float32
    assert drawn.min() >= -1.0 and drawn.max() <= 1.0
    assert drawn.min() < -0.95 and drawn.max() > 0.95  # uses the whole range
    from_emote_space = RandomAgentProxy(action_space=pendulum.spaces.actions, seed=0)
    obs = {i: observation(EpisodeState.RUNNING, obs=[0.0]) for i in range(5)}
    np.testing.assert_array_equal(
        [r.list_data["actions"] for r in from_emote_space(obs).values()],
        [
            r.list_data["actions"]
            for r in RandomAgentProxy(action_space=pendulum.single_action_space, seed=0)(
                obs
            ).values()
        ],
    )
    discrete = RandomAgentProxy(action_space=DiscreteSpace(n=3), seed=0)
    obs = {i: observation(EpisodeState.RUNNING, obs=[0.0]) for i in range(3000)}
    actions = np.array([r.list_data["actions"] for r in discrete(obs).values()])
    assert actions.shape == (3000, 1) and actions.dtype == np.int64
    assert set(np.unique(actions)) == {0, 1, 2}


@pytest.mark.parametrize(
    "space",
    [DiscreteSpace(n=3), gym.spaces.Box(-2.0, np.array([1.0, 5.0]), dtype=np.float32)],
    ids=["discrete", "box"],
)
def test_random_proxy_draws_a_run_of_steps_as_its_calls_one_by_one_would(space) -> None:
    ahead = RandomAgentProxy(action_space=space, seed=5)
    one_by_one = RandomAgentProxy(action_space=space, seed=5)
    block = ahead.act_steps(7, 4)
    batch = {"obs": np.zeros((4, 1))}
    expected = np.stack([one_by_one.act_batch(batch) for _ in range(7)])
    assert block.dtype == expected.dtype and block.shape == expected.shape
    np.testing.assert_array_equal(block, expected)
    # The generators stand at the same place afterwards, and per-agent calls draw alike.
    agents = {i: observation(EpisodeState.RUNNING, obs=[0.0]) for i in range(4)}
    np.testing.assert_array_equal(
        [r.list_data["actions"] for r in ahead(agents).values()],
        [r.list_data["actions"] for r in one_by_one(agents).values()],
    )
    many = ahead.act_steps(2_000, 3)
    if isinstance(space, DiscreteSpace):
        assert set(np.unique(many)) == {0, 1, 2}
        assert np.all(np.abs(np.bincount(many.ravel()) / many.size - 1 / 3) < 0.02)
    else:
        assert np.all(many >= space.low) and np.all(many <= space.high)


def test_epsilon_greedy_acts_on_a_batch_as_on_the_same_agents_one_call() -> None:
    torch.manual_seed(0)
    q_network = nn.Linear(1, 4)  # greedy actions that depend on the rows

    def make() -> EpsilonGreedyAgentProxy:
        return EpsilonGreedyAgentProxy(
            q_network=q_network, device="cpu", num_actions=4, epsilon=0.5, seed=3
        )

    batched, per_agent = make(), make()
    rows = np.random.default_rng(0).standard_normal((6, 1)).astype(np.float32)
    for _ in range(5):
        actions = batched.act_batch({"obs": rows})
        responses = per_agent(
            {i: observation(EpisodeState.RUNNING, obs=row) for i, row in enumerate(rows)}
        )
        assert actions.shape == (6, 1) and actions.dtype == np.int64
        np.testing.assert_array_equal(actions, [r.list_data["actions"] for r in responses.values()])
    with pytest.raises(ConfigurationError, match="reads observation 'obs'"):
        batched.act_batch({"state": rows})


def test_random_proxy_rejects_unbounded_boxes() -> None:
    with pytest.raises(ConfigurationError, match="unbounded"):
        RandomAgentProxy(action_space=gym.spaces.Box(-np.inf, np.inf, (2,)))
    with pytest.raises(ConfigurationError, match="unbounded"):
        RandomAgentProxy(action_space=BoxSpace(np.float32, (2,)))


@pytest.mark.gpu
def test_proxies_act_with_networks_on_cuda() -> None:
    policy = TinyGaussianPolicy().to("cuda")
    proxy = FeatureAgentProxy(policy=policy, device="cuda", seed=0)
    obs = {i: observation(EpisodeState.RUNNING, obs=[0.1, 0.2, 0.3]) for i in range(4)}
    actions = [r.list_data["actions"] for r in proxy(obs).values()]
    assert all(isinstance(a, np.ndarray) and a.shape == (2,) for a in actions)
    greedy = EpsilonGreedyAgentProxy(
        q_network=FavoursTwo().to("cuda"), device="cuda", num_actions=4, epsilon=0.0
    )
    np.testing.assert_array_equal(greedy_share(greedy, agents=16), [0, 0, 1, 0])
