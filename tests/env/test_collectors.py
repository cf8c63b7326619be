"""Collectors on real environments, a real memory table and a real Trainer."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.loss import LossCallback
from emote_core.callbacks.testing import FinalRewardTestCheck
from emote_core.env import (
    HIT_THE_MIDDLE_ID,
    DictGymWrapper,
    GymCollector,
    ThreadedGymCollector,
    make_vector_env,
)
from emote_core.errors import ConfigurationError, SamplingError, TestCheckFailed
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.proxies import FeatureAgentProxy, RandomAgentProxy
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState


class LeanRight(nn.Module):
    """CartPole: push towards the side the pole leans to (an int action via the discrete space)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[:, 2] > 0).float()


class Controller(nn.Module):
    """HitTheMiddle's hand-written controller as a policy."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.clamp(-8.0 * obs[:, :1] - 2.0 * obs[:, 1:2], -1.0, 1.0)


def memory_for(wrapper: DictGymWrapper, maxlen: int = 100_000) -> MemoryTableProxy:
    return MemoryTableProxy(DictObsMemoryTable(spaces=wrapper.spaces, maxlen=maxlen))


def hit_the_middle(num_envs: int = 2) -> DictGymWrapper:
    return DictGymWrapper(make_vector_env(HIT_THE_MIDDLE_ID, num_envs=num_envs))


def single_env_episodes(seed: int, count: int) -> list[dict]:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    episodes = []
    for _ in range(count):
        observations, actions, rewards = [obs], [], []
        while True:
            action = int(obs[2] > 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        end = EpisodeState.from_gymnasium(terminated=terminated, truncated=truncated)
        episodes.append({"obs": observations, "actions": actions, "rewards": rewards, "end": end})
        obs, _ = env.reset()
    return episodes


def test_stored_episodes_equal_what_the_environments_produced() -> None:
    wrapper = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=3))
    memory = memory_for(wrapper)
    agent = FeatureAgentProxy(policy=LeanRight(), device="cpu", spaces=wrapper.spaces)
    collector = GymCollector(env=wrapper, agent=agent, memory=memory, seed=21)
    taken = collector.collect(200)
    assert taken == 600 and collector.env_steps == 600
    stored = {data["obs"][0].tobytes(): (data, end) for _, data, end in memory.table.episodes()}
    assert len(stored) == collector.completed_episodes >= 9
    matched = 0
    for slot in range(3):
        for want in single_env_episodes(21 + slot, 4):
            data, end = stored[np.asarray(want["obs"][0]).tobytes()]
            np.testing.assert_array_equal(data["obs"], np.stack(want["obs"]))
            np.testing.assert_array_equal(data["actions"][:, 0], want["actions"])
            np.testing.assert_array_equal(data["rewards"].ravel(), want["rewards"])
            assert end == want["end"]
            matched += 1
    assert matched == 12
    lengths = collector.windowed_scalar["episode/length"]
    assert sorted(lengths) == sorted(len(d["rewards"]) for d, _ in stored.values())
    assert collector.scalar_logs["training/env_steps"] == 600
    assert collector.scalar_logs["training/scaled_reward"] == pytest.approx(np.mean(lengths))


def test_collect_episodes_stops_once_enough_have_finished() -> None:
    wrapper = hit_the_middle(num_envs=4)
    collector = GymCollector(
        env=wrapper,
        agent=RandomAgentProxy(action_space=wrapper.single_action_space, seed=0),
        memory=memory_for(wrapper),
        seed=0,
        default_window_length=5,
    )
    taken = collector.collect_episodes(6)
    assert taken == 60 * 4  # two rounds of four 30-step episodes
    assert collector.completed_episodes == 8
    assert collector.memory.table.episode_count == 8
    assert collector.scalar_logs["training/completed_episodes"] == 8
    stored_returns = [
        float(data["rewards"].sum()) for _, data, _ in collector.memory.table.episodes()
    ]
    window = list(collector.windowed_scalar["episode/reward"])
    assert window == pytest.approx(stored_returns[-5:], rel=1e-5)  # the last five episodes
    assert collector.scalar_logs["training/scaled_reward"] == pytest.approx(np.mean(window))
    assert collector.scalar_logs["training/scaled_reward"] < -10


def test_warmup_and_per_batch_collection_under_a_trainer_and_resume() -> None:
    wrapper = hit_the_middle(num_envs=2)
    memory = memory_for(wrapper)
    random_agent = RandomAgentProxy(action_space=wrapper.single_action_space, seed=1)
    collector = GymCollector(
        env=wrapper,
        agent=FeatureAgentProxy(policy=Controller(), device="cpu", spaces=wrapper.spaces),
        memory=memory,
        warmup_steps=121,
        inference_steps_per_batch=3,
        seed=1,
        warmup_agent=random_agent,
    )
    loader = MemoryLoader(table=memory.table, rollout_count=8, rollout_length=2)
    Trainer([collector, BackPropStepsTerminator(bp_steps=10)], loader).train()
    warmup = 61 * 2  # 121 env steps rounded up to whole vector steps
    assert collector.env_steps == warmup + 10 * 3 * 2
    # Warm-up episodes were random (about -18), later ones controlled (about -1).
    rewards = list(collector.windowed_scalar["episode/reward"])
    assert len(rewards) == 4 + 2 and max(rewards[:4]) < -5 < min(rewards[4:])

    resumed = GymCollector(
        env=hit_the_middle(num_envs=2),
        agent=random_agent,
        memory=memory_for(wrapper),
        warmup_steps=121,
        inference_steps_per_batch=0,
        seed=1,
    )
    resumed.load_state_dict(collector.state_dict())
    assert resumed.env_steps == collector.env_steps
    assert list(resumed.windowed_scalar["episode/reward"]) == rewards
    resumed.begin_training()
    assert resumed.env_steps == collector.env_steps  # warm-up is not repeated


def test_bp_steps_per_inference_collects_before_every_nth_update_only() -> None:
    wrapper = hit_the_middle(num_envs=2)
    memory = memory_for(wrapper)
    agent = FeatureAgentProxy(policy=Controller(), device="cpu", spaces=wrapper.spaces)
    collector = GymCollector(
        env=wrapper, agent=agent, memory=memory, warmup_steps=120, inference_steps_per_batch=3,
        seed=1, bp_steps_per_inference=4,
    )  # fmt: skip
    seen: list[int] = []

    class Recorder(Callback):
        def end_batch(self) -> None:
            seen.append(collector.env_steps)

    loader = MemoryLoader(table=memory.table, rollout_count=8, rollout_length=2)
    Trainer([collector, Recorder(), BackPropStepsTerminator(bp_steps=9)], loader).train()
    # Updates 1, 5 and 9 collect 3 vector steps of 2 envs; the others train on what is there.
    assert [s - 120 for s in seen] == [6, 6, 6, 6, 12, 12, 12, 12, 18]
    with pytest.raises(ConfigurationError, match="bp_steps_per_inference must be a positive"):
        GymCollector(env=wrapper, agent=collector.agent, memory=memory, bp_steps_per_inference=0)


def test_threaded_collector_grants_steps_every_nth_update_without_free_running() -> None:
    collector, loader, _ = threaded_setup(
        Controller(), ready_check=True, free_running=False, inference_steps_per_batch=2,
        bp_steps_per_inference=5,
    )  # fmt: skip
    Trainer([collector, BackPropStepsTerminator(bp_steps=50)], loader).train()
    assert 60 < collector.env_steps <= 60 + 10 * 2 * 2


def test_ready_check_extends_warmup_until_the_first_batch_can_be_sampled() -> None:
    def build(ready: bool) -> tuple[GymCollector, MemoryLoader]:
        wrapper = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=2))
        memory = memory_for(wrapper)
        loader = MemoryLoader(table=memory.table, rollout_count=32, rollout_length=4)
        collector = GymCollector(
            env=wrapper,
            agent=RandomAgentProxy(action_space=wrapper.single_action_space, seed=0),
            memory=memory,
            warmup_steps=10,
            ready_check=loader if ready else None,
        )
        return collector, loader

    collector, loader = build(ready=False)
    with pytest.raises(SamplingError):
        Trainer([collector, BackPropStepsTerminator(bp_steps=3)], loader).train()
    collector, loader = build(ready=True)
    Trainer([collector, BackPropStepsTerminator(bp_steps=3)], loader).train()
    # Pendulum's first episodes end after 200 steps: that is when the table can be sampled.
    assert collector.env_steps == 200 * 2 + 3 * 2
    assert collector.memory.table.episode_count == 2


@pytest.mark.parametrize(("use_controller", "passes"), [(True, True), (False, False)])
def test_final_reward_check_reads_the_collectors_scaled_reward(
    use_controller: bool, passes: bool
) -> None:
    wrapper = hit_the_middle(num_envs=4)
    memory = memory_for(wrapper)
    if use_controller:
        agent = FeatureAgentProxy(policy=Controller(), device="cpu", spaces=wrapper.spaces)
    else:
        agent = RandomAgentProxy(action_space=wrapper.single_action_space, seed=3)
    collector = GymCollector(
        env=wrapper, agent=agent, memory=memory, warmup_steps=120, inference_steps_per_batch=2
    )
    check = FinalRewardTestCheck(callback=collector, cutoff=-5.0, test_length=30)
    trainer = Trainer(
        [collector, check], MemoryLoader(table=memory.table, rollout_count=4, rollout_length=1)
    )
    if passes:
        state = trainer.train()
        assert state["bp_step"] == 30
    else:
        with pytest.raises(TestCheckFailed, match="training/scaled_reward"):
            trainer.train()


def test_collector_settings_are_validated() -> None:
    wrapper = hit_the_middle()
    agent = RandomAgentProxy(action_space=wrapper.single_action_space)
    with pytest.raises(ConfigurationError, match="warmup_steps"):
        GymCollector(env=wrapper, agent=agent, memory=memory_for(wrapper), warmup_steps=-1)
    with pytest.raises(ConfigurationError, match="sync_every"):
        ThreadedGymCollector(env=wrapper, agent=agent, memory=memory_for(wrapper), sync_every=0)


# The threaded collector.


class Record(list):
    """A list that copies of a policy share (the collector deep-copies its policy)."""

    def __deepcopy__(self, memo: dict) -> Record:
        return self


class UniformnessProbe(nn.Module):
    """A policy that records, at each call, the smallest and largest of all its weights."""

    def __init__(self, seen: Record) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))
        self.seen = seen

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        weights = torch.cat([p.flatten() for p in self.parameters()])
        low = float(weights.min())
        time.sleep(0.0005)  # a copy landing now would show up as a change below
        weights = torch.cat([p.flatten() for p in self.parameters()])
        self.seen.append((min(low, float(weights.min())), float(weights.max())))
        return torch.zeros(obs.shape[0], 1)


class RewriteWeights(LossCallback):
    """A fake loss that sets every weight to the step number, one tensor at a time."""

    def loss(self, bp_step: int) -> torch.Tensor:
        with torch.no_grad():
            for parameter in self.network.parameters():
                parameter.fill_(float(bp_step))
                time.sleep(0.0002)  # widen the window in which weights are mixed
        return sum(p.sum() for p in self.network.parameters()) * 0.0


def threaded_setup(
    policy: nn.Module, *, ready_check: bool = False, **collector_kwargs
) -> tuple[ThreadedGymCollector, MemoryLoader, FeatureAgentProxy]:
    wrapper = hit_the_middle(num_envs=2)
    memory = memory_for(wrapper)
    loader = MemoryLoader(table=memory.table, rollout_count=8, rollout_length=1)
    agent = FeatureAgentProxy(policy=policy, device="cpu", spaces=wrapper.spaces)
    collector = ThreadedGymCollector(
        env=wrapper,
        agent=agent,
        memory=memory,
        seed=0,
        ready_check=loader if ready_check else None,
        **collector_kwargs,
    )
    return collector, loader, agent


def test_threaded_collector_never_acts_with_half_updated_weights() -> None:
    seen = Record()
    policy = UniformnessProbe(seen)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.fill_(0.0)
    collector, loader, agent = threaded_setup(policy, warmup_steps=60, sync_every=1)
    loss = RewriteWeights(
        name="rewrite", network=policy, optimizer=torch.optim.SGD(policy.parameters(), lr=0.1)
    )
    trainer = Trainer([collector, loss, BackPropStepsTerminator(bp_steps=150)], loader)
    trainer.train()
    assert agent.policy is policy  # handed back to the training network
    assert collector._thread is None
    assert len(seen) > 30 + 20  # 30 warm-up calls, then more while training
    mixed = [(low, high) for low, high in seen if low != high]
    assert mixed == [], f"the collector acted with mixed weights {mixed[:5]}"
    values = [low for low, _ in seen]
    assert values == sorted(values)  # copies only ever get newer
    assert values[-1] > 1  # and the collector did pick the trained weights up
    assert collector.syncs == 150
    assert collector.env_steps >= 60


def test_threaded_collector_raises_the_threads_error_on_the_training_thread() -> None:
    class Breaks(nn.Module):
        calls = 0

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            Breaks.calls += 1
            if Breaks.calls > 40:
                raise RuntimeError("policy exploded")
            return torch.zeros(obs.shape[0], 1)

    collector, loader, _ = threaded_setup(Breaks(), warmup_steps=60)
    trainer = Trainer([collector, BackPropStepsTerminator(bp_steps=100_000)], loader)
    with pytest.raises(RuntimeError, match="policy exploded") as raised:
        trainer.train()
    assert any("collector thread" in note for note in raised.value.__notes__)
    assert trainer.state["bp_step"] < 100_000
    assert collector._thread is None


class Acted(threading.Event):
    """Set at a policy's first action; copies of the policy share it."""

    def __deepcopy__(self, memo: dict) -> Acted:
        return self


class ActingController(Controller):
    """The controller, saying when it first acted."""

    def __init__(self) -> None:
        super().__init__()
        self.acted = Acted()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.acted.set()
        return super().forward(obs)


def test_threaded_collector_stops_when_shutdown_is_requested_during_warmup(no_hang: None) -> None:
    policy = ActingController()
    collector, loader, _ = threaded_setup(policy, warmup_steps=10**9)
    trainer = Trainer([collector], loader)
    # Shutdown is asked for once the collector acts; only it can end a warm-up of 10**9 steps.
    stopper = threading.Thread(
        target=lambda: policy.acted.wait(timeout=60) and trainer.shutdown_signal.set()
    )
    stopper.start()
    state = trainer.train()
    stopper.join()
    assert state["bp_step"] == 0
    assert collector._thread is None
    assert 0 < collector.env_steps < 10**9


def test_threaded_collector_can_keep_the_per_batch_ratio() -> None:
    collector, loader, _ = threaded_setup(
        Controller(), ready_check=True, free_running=False, inference_steps_per_batch=2
    )
    Trainer([collector, BackPropStepsTerminator(bp_steps=50)], loader).train()
    # Warm-up lasts until the first 30-step episodes are in the table: 30 vector steps.
    assert 60 < collector.env_steps <= 60 + 50 * 2 * 2
    logged = collector.scalar_logs["training/env_steps"]
    assert logged == collector.env_steps
    assert collector.scalar_logs["training/scaled_reward"] > -5


class ExportRequests:
    """Stands in for an ONNX exporter: records when the training thread serves its queue."""

    def __init__(self, collector_steps) -> None:
        self.collector_steps = collector_steps
        self.served_at: list[tuple[int, int]] = []  # (thread id, collector env steps)

    def process_pending_exports(self) -> None:
        self.served_at.append((threading.get_ident(), self.collector_steps()))


@pytest.mark.parametrize("threaded", [False, True])
def test_warm_up_serves_export_requests_on_the_training_thread(threaded: bool) -> None:
    wrapper = hit_the_middle(num_envs=2)
    memory = memory_for(wrapper)
    loader = MemoryLoader(table=memory.table, rollout_count=8, rollout_length=1)
    kind = ThreadedGymCollector if threaded else GymCollector
    extra = {"agent": FeatureAgentProxy(policy=Controller(), device="cpu", spaces=wrapper.spaces)}
    if not threaded:
        extra = {"agent": RandomAgentProxy(action_space=wrapper.single_action_space, seed=0)}
    collector = kind(env=wrapper, memory=memory, warmup_steps=4_000, seed=0, **extra)
    requests = ExportRequests(lambda: collector.env_steps)
    collector.exporter = requests
    Trainer([collector, BackPropStepsTerminator(bp_steps=1)], loader).train()
    assert requests.served_at, "warm-up never served the exporter's queue"
    assert {thread for thread, _ in requests.served_at} == {threading.get_ident()}
    assert min(steps for _, steps in requests.served_at) < 4_000  # before warm-up was over
