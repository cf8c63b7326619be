"""SkrlMemory answers skrl's memory calls as skrl's RandomMemory does, from an emote table."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError, SamplingError
from emote_core.integrations.skrl.memory import SkrlMemory
from emote_core.typing import EpisodeState

skrl_memories = pytest.importorskip("skrl.memories.torch", reason="skrl is in the dev extra")

NAMES = ("observations", "next_observations", "actions", "rewards", "terminated", "truncated")


def _create(memory, names=NAMES) -> None:
    sizes = {"observations": 4, "next_observations": 4, "actions": 1, "rewards": 1}
    for name in names:
        dtype = torch.bool if name in ("terminated", "truncated") else torch.float32
        memory.create_tensor(name=name, size=sizes.get(name, 1), dtype=dtype)


def _collect(memories, *, envs: int, steps: int, limit: int = 12, names=NAMES, seed: int = 3):
    """Real CartPole envs (time limit ``limit``, random actions) add the same rows to every
    memory; returns each env's episodes as the envs made them: (obs rows, rewards, end)."""
    made = [gym.make("CartPole-v1", max_episode_steps=limit) for _ in range(envs)]
    observations = []
    for i, env in enumerate(made):
        env.action_space.seed(seed + i)
        observations.append(env.reset(seed=seed + i)[0])
    episodes = [[{"obs": [o], "rewards": []}] for o in observations]
    for _ in range(steps):
        rows = {name: [] for name in names}
        for i, env in enumerate(made):
            action = env.action_space.sample()
            after, reward, terminated, truncated, _ = env.step(action)
            values = {
                "observations": observations[i],
                "next_observations": after,
                "actions": [float(action)],
                "rewards": [reward],
                "terminated": [terminated],
                "truncated": [truncated],
            }
            for name in names:
                rows[name].append(values[name])
            episodes[i][-1]["obs"].append(after)
            episodes[i][-1]["rewards"].append(reward)
            observations[i] = after
            if terminated or truncated:
                episodes[i][-1]["end"] = (
                    EpisodeState.TERMINAL if terminated else EpisodeState.INTERRUPTED
                )
                observations[i] = env.reset()[0]
                episodes[i].append({"obs": [observations[i]], "rewards": []})
        tensors = {n: torch.tensor(np.asarray(v)) for n, v in rows.items()}
        for memory in memories:
            memory.add_samples(**tensors)
    return episodes


def _equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())  # NaN equals NaN here


@pytest.mark.parametrize(("envs", "steps"), [(1, 30), (2, 37), (3, 40)])
def test_ring_and_tensors_match_skrls_random_memory(envs, steps):
    theirs = skrl_memories.RandomMemory(memory_size=40, num_envs=envs, device="cpu")
    ours = SkrlMemory(memory_size=40, num_envs=envs, device="cpu")
    for memory in (theirs, ours):
        _create(memory)
    _collect([theirs, ours], envs=envs, steps=steps)
    assert (len(ours), ours.memory_index, ours.env_index, ours.filled) == (
        len(theirs), theirs.memory_index, theirs.env_index, theirs.filled,
    )  # fmt: skip
    assert ours.get_tensor_names() == theirs.get_tensor_names()
    for name in NAMES:
        _equal(ours.get_tensor_by_name(name), theirs.get_tensor_by_name(name))
    indexes = np.random.default_rng(0).permutation(len(theirs))[:25]
    (mine,) = ours.sample_by_index(list(NAMES), indexes=indexes)
    (skrls,) = theirs.sample_by_index(list(NAMES), indexes=indexes)
    for a, b in zip(mine, skrls, strict=True):
        _equal(a, b)
    split = ours.sample_all(["rewards", "missing"], mini_batches=3)
    expected = theirs.sample_all(["rewards", "missing"], mini_batches=3)
    assert [b[1] for b in split] == [None, None, None]
    for a, b in zip(split, expected, strict=True):
        _equal(a[0], b[0])
    sequences = ours.sample_all(["observations"], sequence_length=4)[0][0]
    _equal(sequences, theirs.sample_all(["observations"], sequence_length=4)[0][0])


def test_rows_become_whole_episodes_in_the_table_with_their_end_states():
    memory = SkrlMemory(memory_size=100, num_envs=2, device="cpu")
    _create(memory)
    made = _collect([memory], envs=2, steps=60)
    assert memory.table is not None
    held = list(memory.table.episodes())
    finished = [[e for e in env if "end" in e] for env in made]
    assert len(held) == sum(len(f) for f in finished)
    by_first = {tuple(np.round(data["observations"][0], 6)): (data, end) for _, data, end in held}
    for episode in (e for env in finished for e in env):
        data, end = by_first[tuple(np.round(episode["obs"][0], 6))]
        assert end == episode["end"]
        np.testing.assert_allclose(data["observations"], np.asarray(episode["obs"]), rtol=1e-6)
        np.testing.assert_allclose(data["rewards"][:, 0], episode["rewards"])
    ends = {end for _, _, end in held}
    assert ends == {EpisodeState.TERMINAL, EpisodeState.INTERRUPTED}
    assert memory.inferred_cuts == 0  # every end was flagged


def test_unflagged_resets_end_episodes_as_skrl2_sac_stores_no_truncated():
    names = ("observations", "next_observations", "actions", "rewards", "terminated")
    memory = SkrlMemory(memory_size=200, device="cpu")
    _create(memory, names)
    made = _collect([memory], envs=1, steps=50, limit=8, names=names)
    cut = [e for e in made[0] if e.get("end") == EpisodeState.INTERRUPTED]
    assert cut and memory.inferred_cuts == len(cut)
    # Each time-limit end is found when the next row starts elsewhere; the open one waits.
    finished = [e for e in made[0] if "end" in e]
    assert made[0][-1]["rewards"], "the last episode must be open for this test"
    held = list(memory.table.episodes())
    assert [len(d["rewards"]) for _, d, _ in held] == [len(e["rewards"]) for e in finished]
    assert [end for _, _, end in held] == [e["end"] for e in finished]
    memory.flush()
    held = list(memory.table.episodes())
    assert [len(d["rewards"]) for _, d, _ in held] == [len(e["rewards"]) for e in made[0]]
    for (_, data, _), episode in zip(held, made[0], strict=True):
        np.testing.assert_allclose(data["observations"], np.asarray(episode["obs"]), rtol=1e-6)


def test_sampling_is_without_replacement_unless_asked_and_reports_its_indexes():
    memory = SkrlMemory(memory_size=30, num_envs=2, device="cpu", seed=1)
    _create(memory)
    _collect([memory], envs=2, steps=10)
    batches = memory.sample(["rewards", "actions"], batch_size=50, mini_batches=2)
    assert len(batches) == 2 and all(len(b) == 2 for b in batches)
    indexes = memory.get_sampling_indexes()
    assert len(indexes) == len(memory) == 20  # at most what is held, each row once
    assert len(set(indexes.tolist())) == 20
    (again,) = memory.sample_by_index(["rewards"], indexes=indexes)
    _equal(torch.cat([batches[0][0], batches[1][0]]), again[0])
    replaced = SkrlMemory(memory_size=30, num_envs=2, device="cpu", replacement=True, seed=1)
    _create(replaced)
    _collect([replaced], envs=2, steps=10)
    (rows,) = replaced.sample(["rewards"], batch_size=50)
    assert len(rows[0]) == 50 and not torch.isnan(rows[0]).any()
    seeded = [SkrlMemory(memory_size=30, device="cpu", seed=7) for _ in range(2)]
    for memory in seeded:
        _create(memory)
    _collect(seeded, envs=1, steps=20)
    first, second = (m.sample(["actions"], batch_size=8)[0][0] for m in seeded)
    _equal(first, second)


def test_an_empty_memory_refuses_to_sample():
    memory = SkrlMemory(memory_size=10, device="cpu")
    _create(memory)
    with pytest.raises(SamplingError, match="empty"):
        memory.sample(["rewards"], batch_size=4)


def test_ejected_episodes_are_never_sampled_and_the_ring_keeps_skrls_counts():
    memory = SkrlMemory(memory_size=20, device="cpu", seed=2)
    _create(memory)
    _collect([memory], envs=1, steps=95, limit=7)
    assert memory.filled and len(memory) == 20
    assert memory.table.size() <= 40  # old episodes left the table: it holds two ring sizes
    assert memory.table.episode_count < 95 // 7
    # Every row the ring points at is still held, however episodes straddle the ring.
    for name in ("observations", "next_observations", "rewards"):
        assert not torch.isnan(memory.get_tensor_by_name(name)).any()
    for _ in range(20):
        (rows,) = memory.sample(["observations", "next_observations"], batch_size=20)
        assert not torch.isnan(rows[0]).any() and not torch.isnan(rows[1]).any()


def test_set_tensor_by_name_writes_through_to_table_and_open_rows():
    theirs = skrl_memories.RandomMemory(memory_size=30, num_envs=2, device="cpu")
    memory = SkrlMemory(memory_size=30, num_envs=2, device="cpu")
    for each in (theirs, memory):
        _create(each)
        each.create_tensor(name="advantages", size=1, dtype=torch.float32)
    _collect([theirs, memory], envs=2, steps=25)
    values = torch.arange(60, dtype=torch.float32).reshape(30, 2, 1)
    for each in (theirs, memory):
        each.set_tensor_by_name("advantages", values)
    _equal(memory.get_tensor_by_name("advantages"), values)  # rows not added yet keep theirs too
    _equal(theirs.get_tensor_by_name("advantages"), values)
    held = [d["advantages"][:, 0] for _, d, _ in memory.table.episodes()]
    assert all(len(h) for h in held) and set(np.concatenate(held).tolist()) <= set(range(50))
    with pytest.raises(ValueError, match="derived from 'observations'"):
        memory.set_tensor_by_name("next_observations", torch.zeros(30, 2, 4))


def test_values_set_before_rows_are_added_read_back_until_rows_replace_them():
    theirs = skrl_memories.RandomMemory(memory_size=5, num_envs=2, device="cpu")
    ours = SkrlMemory(memory_size=5, num_envs=2, device="cpu")
    for memory in (theirs, ours):
        memory.create_tensor(name="rewards", size=1, dtype=torch.float32)
        memory.set_tensor_by_name("rewards", torch.arange(10).reshape(5, 2, 1))
    _equal(ours.get_tensor_by_name("rewards"), theirs.get_tensor_by_name("rewards"))
    for memory in (theirs, ours):
        memory.add_samples(rewards=torch.full((2, 1), -1.0))
    _equal(ours.get_tensor_by_name("rewards"), theirs.get_tensor_by_name("rewards"))
    (rows,) = ours.sample_by_index(["rewards"], indexes=[0, 1, 2, 9])
    assert rows[0][:, 0].tolist() == [-1.0, -1.0, 2.0, 9.0]
    ours.clear()
    assert torch.isnan(ours.get_tensor_by_name("rewards")).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a CPU-only torch")
def test_a_device_torch_cannot_use_falls_back_as_skrls_does(caplog):
    theirs = skrl_memories.RandomMemory(memory_size=3, device="cuda:0")
    with caplog.at_level("WARNING", logger="emote_core.integrations.skrl.memory"):
        ours = SkrlMemory(memory_size=3, device="cuda:0")
    assert ours.device == theirs.device == torch.device("cpu")
    assert "cannot use device 'cuda:0'" in caplog.text
    ours.create_tensor(name="rewards", size=1)
    ours.add_samples(rewards=torch.ones(1, 1))
    assert ours.get_tensor_by_name("rewards")[0, 0].item() == 1.0


def test_create_tensor_follows_skrl_and_refuses_late_tensors():
    memory = SkrlMemory(memory_size=5, device="cpu")
    assert memory.create_tensor("states", size=None) is False
    assert memory.create_tensor("observations", size=gym.spaces.Box(-1, 1, (2, 3))) is True
    assert memory.create_tensor("actions", size=gym.spaces.Discrete(4), dtype=torch.int64)
    assert memory.create_tensor("observations", size=6) is False
    with pytest.raises(ValueError, match="size 6"):
        memory.create_tensor("observations", size=5)
    memory.create_tensor("rewards", size=1)
    memory.add_samples(
        observations=torch.zeros(1, 6), actions=torch.ones(1, 1, dtype=torch.int64),
        rewards=torch.ones(1, 1),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="created after rows were added"):
        memory.create_tensor("values", size=1)
    with pytest.raises(ConfigurationError, match="ParallelTrainer"):
        memory.share_memory()


def test_it_is_a_skrl_memory_and_emote_imports_it_without_skrl():
    assert isinstance(SkrlMemory(memory_size=2, device="cpu"), skrl_memories.Memory)
    code = (
        "import sys; sys.modules['skrl'] = None\n"
        "from emote_core.integrations.skrl.memory import SkrlMemory\n"
        "m = SkrlMemory(memory_size=3, device='cpu')\n"
        "m.create_tensor('rewards', size=1)\n"
        "print(len(m), 'skrl' in sys.modules and sys.modules['skrl'] is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0", "False"]
