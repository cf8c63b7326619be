"""The MBPO callbacks: the Bernoulli batch choice, the held-out split, rollouts into the model
memory, the model's training step and its held-out check, and their checkpoints."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from emote_core.callbacks.compiled import compile_methods
from emote_core.errors import ConfigurationError, TestCheckFailed
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.models import DynamicModel, EnsembleOfGaussian, ModelEnv
from emote_core.models.callbacks import (
    BatchSampler,
    LossProgressCheck,
    LossProgressTestCheck,
    ModelBasedCollector,
    ModelLoss,
    is_holdout,
)
from emote_core.proxies.generic import GenericAgentProxy
from emote_core.schedules import ConstantSchedule, TruncatedLinearSchedule
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,)),
    state=DictSpace({"obs": BoxSpace(np.float32, (2,))}),
)


class AddModel:
    """``next = observation + action``, reward ``-|next|``."""

    def sample(self, observation, action, *, generator=None):
        next_observation = observation + action
        return next_observation, -next_observation.abs().sum(dim=1, keepdim=True)


class Halving(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return -0.5 * obs


def table(maxlen: int = 1_000) -> DictObsMemoryTable:
    return DictObsMemoryTable(spaces=SPACES, maxlen=maxlen, device="cpu", seed=0)


def filled(episodes: int, length: int = 4) -> DictObsMemoryTable:
    held = table()
    for identity in range(episodes):
        obs = np.full((length + 1, 2), identity, np.float32)
        held.add_sequence(identity, {
            "obs": obs, "actions": np.zeros((length, 2), np.float32),
            "rewards": np.zeros((length, 1), np.float32),
        })  # fmt: skip
    return held


# BatchSampler.


class FakeLoader:
    data_group = "default"

    def __init__(self, ready: bool = True) -> None:
        self.ready = ready
        self.sampled = 0

    def is_ready(self) -> bool:
        return self.ready

    def sample(self) -> dict:
        self.sampled += 1
        return {"default": {"source": "model"}, "batch_size": 1}


@pytest.mark.parametrize(("probability", "low", "high"), [(0.0, 0, 0), (0.5, 450, 550),
                                                          (1.0, 1000, 1000)])  # fmt: skip
def test_batch_sampler_draws_model_batches_at_the_scheduled_frequency(
    probability: float, low: int, high: int
) -> None:
    loader = FakeLoader()
    sampler = BatchSampler(dataloader=loader, prob_scheduler=ConstantSchedule(probability), seed=3)
    chosen = [sampler.begin_batch(bp_step=step) for step in range(1, 1001)]
    count = sum(result is not None for result in chosen)
    assert low <= count <= high and loader.sampled == count == sampler.model_batches
    if count:
        assert next(r for r in chosen if r is not None) == {"default": {"source": "model"}}
    again = BatchSampler(dataloader=FakeLoader(), prob_scheduler=ConstantSchedule(probability),
                         seed=3)  # fmt: skip
    assert [again.begin_batch(bp_step=s) is not None for s in range(1, 1001)] == [
        r is not None for r in chosen
    ]


def test_batch_sampler_follows_its_schedule_and_keeps_the_real_batch_until_the_memory_fills() -> (
    None
):
    loader = FakeLoader(ready=False)
    sampler = BatchSampler(
        dataloader=loader, prob_scheduler=TruncatedLinearSchedule(100, 100, 0.0, 1.0), seed=0
    )
    assert all(sampler.begin_batch(bp_step=step) is None for step in range(1, 101))
    assert sampler.begin_batch(bp_step=101) is None and loader.sampled == 0  # not ready
    loader.ready = True
    assert sampler.begin_batch(bp_step=102) == {"default": {"source": "model"}}
    assert sampler.scalar_logs["training/prob_sampling_from_model"] == 1.0


def test_batch_sampler_resumes_its_draws_from_a_checkpoint() -> None:
    first = BatchSampler(dataloader=FakeLoader(), prob_scheduler=ConstantSchedule(0.5), seed=9)
    for step in range(1, 50):
        first.begin_batch(bp_step=step)
    restored = BatchSampler(dataloader=FakeLoader(), prob_scheduler=ConstantSchedule(0.5), seed=0)
    restored.load_state_dict(first.state_dict())
    assert [restored.use_model_batch(s) for s in range(50, 150)] == [
        first.use_model_batch(s) for s in range(50, 150)
    ]


def test_batch_sampler_refuses_a_probability_outside_0_1() -> None:
    sampler = BatchSampler(dataloader=FakeLoader(), prob_scheduler=ConstantSchedule(1.5))
    with pytest.raises(ConfigurationError, match=r"probability of 1.5 at update 1.*\[0, 1\]"):
        sampler.begin_batch(bp_step=1)


# The held-out split.


def test_the_holdout_is_an_even_fifth_of_consecutive_episodes_and_never_the_first() -> None:
    held = is_holdout(np.arange(10_000), 0.2)
    assert not held[0]
    assert 0.19 < held.mean() < 0.21
    assert all(0 < held[k : k + 10].sum() <= 3 for k in range(0, 10_000, 10))  # spread evenly
    assert not is_holdout(np.arange(100), 0.0).any()
    huge = np.array([2**62, -5, 2**63 - 1], dtype=np.int64)
    assert is_holdout(huge, 0.2).shape == (3,)


# ModelBasedCollector.


def collector(memory_table: DictObsMemoryTable, **overrides) -> ModelBasedCollector:
    agent = GenericAgentProxy(policy=Halving(), device="cpu", input_keys=["obs"],
                              output_keys=["actions"], spaces=SPACES)  # fmt: skip
    settings = {
        "model_env": ModelEnv(model=AddModel(), termination_fn="none"),
        "agent": agent, "memory": MemoryTableProxy(memory_table),
        "rollout_scheduler": TruncatedLinearSchedule(10, 20, 1, 3),
        "num_bp_to_retain_buffer": 2,
    }  # fmt: skip
    settings.update(overrides)
    return ModelBasedCollector(**settings)


def test_rollouts_branch_from_the_batch_with_the_policy_and_keep_the_last_updates_only() -> None:
    memory_table = table()
    model_collector = collector(memory_table, rollout_batch_size=3, warmup_bp_steps=5)
    batch = {"obs": torch.tensor([[2.0, 4.0], [8.0, -2.0], [0.0, 0.0], [100.0, 100.0]])}
    model_collector.begin_batch(observation=batch, bp_step=5)  # still in the warm-up
    assert memory_table.size() == 0
    model_collector.begin_batch(observation=batch, bp_step=6)
    # One-step rollouts of the first 3 rows: action -obs/2, next = obs/2, reward -|next|.
    sampled = memory_table.sample_all()
    torch.testing.assert_close(sampled["observation"]["obs"], batch["obs"][:3])
    torch.testing.assert_close(sampled["actions"], -0.5 * batch["obs"][:3])
    torch.testing.assert_close(sampled["next_observation"]["obs"], 0.5 * batch["obs"][:3])
    torch.testing.assert_close(sampled["rewards"], torch.tensor([[-3.0], [-5.0], [0.0]]))
    assert sampled["masks"].flatten().tolist() == [1.0, 1.0, 1.0]  # INTERRUPTED at length 1
    for step in (7, 8, 9):
        model_collector.begin_batch(observation=batch, bp_step=step)
    assert memory_table.size() == 2 * 3  # the last 2 updates' rollouts
    assert memory_table.maxlen == 6
    model_collector.begin_batch(observation=batch, bp_step=20)  # the ramp's end: length 3
    assert model_collector.rollout_length == 3
    assert memory_table.maxlen == 3 * 3 * 2
    lengths = {len(e["actions"]) for _, e, _ in memory_table.episodes()}
    assert 3 in lengths
    assert model_collector.scalar_logs["training/model_rollout_length"] == 3


def test_a_schedule_giving_rollout_lengths_below_1_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"rollout length of 0\.0 at update 1; rollout"):
        collector(table(), rollout_scheduler=ConstantSchedule(0.0))
    with pytest.raises(ConfigurationError, match="num_bp_to_retain_buffer must be a positive"):
        collector(table(), num_bp_to_retain_buffer=0)


def test_the_collector_s_rollouts_resume_from_a_checkpoint() -> None:
    def noisy() -> ModelBasedCollector:
        agent = GenericAgentProxy(policy=NoisyHalving(), device="cpu", input_keys=["obs"],
                                  output_keys=["actions"], spaces=SPACES, seed=4)  # fmt: skip
        return collector(table(), agent=agent)

    batch = {"obs": torch.randn(8, 2, generator=torch.Generator().manual_seed(0))}
    first = noisy()
    first.begin_batch(observation=batch, bp_step=1)
    restored = noisy()
    restored.load_state_dict(first.state_dict())
    first.begin_batch(observation=batch, bp_step=2)
    restored.begin_batch(observation=batch, bp_step=2)
    a, b = (c.memory.table.sample_all()["actions"][-8:] for c in (first, restored))
    torch.testing.assert_close(a, b)


class NoisyHalving(torch.nn.Module):
    action_dim = 2

    def forward(self, obs: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
        return -0.5 * obs + epsilon


def test_model_memory_feeds_the_loader_the_batch_sampler_draws_from() -> None:
    memory_table = table()
    model_collector = collector(memory_table)
    batch = {"obs": torch.ones(4, 2)}
    loader = MemoryLoader(table=memory_table, rollout_count=4, rollout_length=1)
    assert not loader.is_ready()
    model_collector.begin_batch(observation=batch, bp_step=1)
    sampler = BatchSampler(dataloader=loader, prob_scheduler=ConstantSchedule(1.0))
    drawn = sampler.begin_batch(bp_step=1)
    assert drawn is not None
    torch.testing.assert_close(drawn["default"]["next_observation"]["obs"], torch.full((4, 2), 0.5))


# ModelLoss and LossProgressCheck, on a linear system in a real table.

A = torch.tensor([[0.9, 0.1], [-0.2, 0.8]])
B = torch.tensor([[0.5, 0.0], [0.1, 0.3]])


def linear_episodes(episodes: int, length: int = 50) -> DictObsMemoryTable:
    """Episodes of ``s' = A s + B a`` with reward ``s[0]``; each episode's identity is
    recoverable from its actions' sign pattern (``actions[:, 1] = identity``)."""
    generator = torch.Generator().manual_seed(0)
    held = table(maxlen=episodes * length)
    for identity in range(episodes):
        states = [torch.randn(2, generator=generator)]
        actions = torch.rand(length, 2, generator=generator) * 2 - 1
        actions[:, 1] = float(identity) / episodes
        for k in range(length):
            states.append(A @ states[-1] + B @ actions[k])
        obs = torch.stack(states)
        held.add_sequence(identity, {
            "obs": obs.numpy(), "actions": actions.numpy(),
            "rewards": obs[:-1, :1].numpy(),
        })  # fmt: skip
    return held


def small_model(seed: int = 0) -> DynamicModel:
    network = EnsembleOfGaussian(in_size=4, out_size=3, ensemble_size=3, num_elites=2,
                                 hidden_size=32, num_layers=2,
                                 generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return DynamicModel(model=network, observation_size=2, action_size=2)


def model_loss(model: DynamicModel, held: DictObsMemoryTable, **overrides) -> ModelLoss:
    settings = {"model": model, "table": held, "holdout_fraction": 0.2, "seed": 1,
                "optimizer": torch.optim.Adam(model.parameters(), lr=3e-3)}  # fmt: skip
    settings.update(overrides)
    return ModelLoss(**settings)


def train(loss: ModelLoss, loader: MemoryLoader, steps: int, first: int = 1) -> None:
    for step in range(first, first + steps):
        batch = loader.sample()["default"]
        loss.begin_batch(observation=batch["observation"], actions=batch["actions"],
                         next_observation=batch["next_observation"], rewards=batch["rewards"],
                         bp_step=step)  # fmt: skip


@pytest.mark.usefixtures("one_torch_thread")
def test_the_model_never_trains_on_held_out_episodes() -> None:
    held = linear_episodes(10)
    model = small_model()
    seen: list[torch.Tensor] = []
    original = model.training_rows

    def spy(observation, next_observation, action, reward=None, **kwargs):
        seen.append(action[:, 1].clone())
        return original(observation, next_observation, action, reward, **kwargs)

    model.training_rows = spy  # type: ignore[method-assign]
    loss = model_loss(model, held)
    train(loss, MemoryLoader(table=held, rollout_count=64, rollout_length=1), 30)
    identities = torch.round(torch.cat(seen) * 10).long().unique().tolist()
    held_out = np.flatnonzero(is_holdout(np.arange(10), 0.2)).tolist()
    assert held_out == [4, 9]
    assert sorted(identities) == [i for i in range(10) if i not in held_out]
    assert loss.steps == 30
    assert "model/dynamic_model_train_mse" in loss.scalar_logs


@pytest.mark.usefixtures("one_torch_thread")
def test_the_model_steps_every_train_interval_updates_only() -> None:
    held = linear_episodes(5)
    loss = model_loss(small_model(), held, train_interval=4)
    train(loss, MemoryLoader(table=held, rollout_count=32, rollout_length=1), 10)
    assert loss.steps == 2  # updates 4 and 8
    with pytest.raises(ConfigurationError, match="train_interval must be a positive integer"):
        model_loss(small_model(), held, train_interval=0)
    with pytest.raises(ConfigurationError, match=r"holdout_fraction must be in \[0, 1\)"):
        model_loss(small_model(), held, holdout_fraction=1.0)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_held_out_check_picks_elites_and_says_whether_the_error_still_falls() -> None:
    held = linear_episodes(10)
    model = small_model()
    loss = model_loss(model, held)
    check = LossProgressCheck(model=model, table=held, holdout_fraction=0.2, interval=100)
    loader = MemoryLoader(table=held, rollout_count=128, rollout_length=1)
    train(loss, loader, 10)
    untrained = check.check()
    assert untrained is not None and check.scalar_logs["model/holdout_falling"] == 1.0
    assert check.scalar_logs["model/holdout_rows"] == 2 * 50  # the two held-out episodes
    train(loss, loader, 400, first=11)
    trained = check.check()
    assert trained is not None and trained < 0.2 * untrained
    assert check.scalar_logs["model/holdout_falling"] == 1.0
    scores = model.member_mse(*held_out_rows(held))
    assert sorted(model.model.elites.tolist()) == sorted(scores.argsort()[:2].tolist())
    assert check.check() == pytest.approx(trained)  # nothing trained since: not falling
    assert check.scalar_logs["model/holdout_falling"] == 0.0
    assert check.scalar_logs["model/checks_since_improvement"] == 1.0
    assert check.begin_batch(bp_step=150) is None and check.checks_since_improvement == 1

    restored = LossProgressCheck(model=model, table=held, holdout_fraction=0.2, interval=100)
    restored.load_state_dict(check.state_dict())
    assert (restored.best, restored.checks_since_improvement) == (trained, 1)


def through_a_file(state: dict) -> dict:
    """What a checkpoint gives back (a live state dict shares the optimizer's tensors)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def held_out_rows(held: DictObsMemoryTable) -> tuple[torch.Tensor, ...]:
    batch = held.sample_by_index([4] * 50 + [9] * 50, list(range(50)) * 2, 1)
    return (batch["observation"]["obs"], batch["next_observation"]["obs"], batch["actions"],
            batch["rewards"])  # fmt: skip


@pytest.mark.usefixtures("one_torch_thread")
def test_the_model_loss_resumes_exactly_from_its_checkpoint() -> None:
    held = linear_episodes(5)
    loader = MemoryLoader(table=held, rollout_count=32, rollout_length=1)
    first = model_loss(small_model(), held)
    train(first, loader, 5)
    restored = model_loss(small_model(seed=7), held)
    restored.load_state_dict(through_a_file(first.state_dict()))
    assert restored.steps == 5
    batch = loader.sample()["default"]
    for loss in (first, restored):
        loss.table = None  # both train on the same rows
        loss.begin_batch(observation=batch["observation"], actions=batch["actions"],
                         next_observation=batch["next_observation"], rewards=batch["rewards"],
                         bp_step=6)  # fmt: skip
    for a, b in zip(first.model.state_dict().values(), restored.model.state_dict().values(),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_compiled_model_loss_is_one_graph_and_trains_as_the_eager_one(graph_counts) -> None:
    held = linear_episodes(5)
    eager, compiled = (model_loss(small_model(), held) for _ in range(2))
    assert compile_methods([compiled], backend="aot_eager") == 1
    loader = MemoryLoader(table=held, rollout_count=32, rollout_length=1)
    for step in range(1, 13):
        batch = loader.sample()["default"]
        rows = {
            "observation": batch["observation"],
            "actions": batch["actions"],
            "next_observation": batch["next_observation"],
            "rewards": batch["rewards"],
        }
        for loss in (eager, compiled):
            loss.begin_batch(**rows, bp_step=step)
    # The bootstrap draws and the normalisers' update run eagerly around the graph: one for the
    # first batch's row count, then one for any count (the held-out rows left out vary it).
    assert graph_counts() == (2, 0)
    assert compiled.steps == eager.steps == 12
    for (name, a), b in zip(eager.model.state_dict().items(),
                            compiled.model.state_dict().values(), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, msg=name)
    assert compiled.generator.get_state().equal(eager.generator.get_state())


class ScriptedError:
    """Predicts the batch's next observation and reward off by the next of ``errors``."""

    def __init__(self, errors: list[float]) -> None:
        self.errors = iter(errors)
        self.batch: dict = {}

    def sample(self, observation, action, *, generator=None):
        error = next(self.errors)
        return self.batch["next"] + error, self.batch["rewards"] - error


def scripted_run(errors: list[float]) -> int:
    model = ScriptedError(errors)
    batches = []
    for _ in errors:
        group = {
            "observation": {"obs": torch.zeros(2, 2)},
            "actions": torch.zeros(2, 2),
            "next_observation": {"obs": torch.ones(2, 2)},
            "rewards": torch.ones(2, 1),
        }
        batches.append({"batch_size": 2, "default": group})
    model.batch = {"next": torch.ones(2, 2), "rewards": torch.ones(2, 1)}
    check = LossProgressTestCheck(model=model, num_bp=len(errors))
    return Trainer([check], batches + batches).train()["bp_step"]


def test_the_loss_progress_test_check_stops_a_falling_run_and_fails_a_rising_one() -> None:
    falling = [1.0 / (k + 1) for k in range(20)]  # windows of 2 updates
    assert scripted_run(falling) == 20  # stopped at num_bp, before the second pass
    noisy = falling[:16] + [falling[12] * 1.05] * 4  # within the 10% tolerance of noise
    assert scripted_run(noisy) == 20
    with pytest.raises(TestCheckFailed, match=r"observation error .* \(windows 5 and 9\)"):
        scripted_run(falling[:18] + [falling[10] * 1.5] * 2)
    with pytest.raises(TestCheckFailed, match="first and last"):
        scripted_run([0.5] * 20)
