"""TmrlMemory with files: tmrl's own datasets as ``dataset_path``, datasets and stores out."""

from __future__ import annotations

import json
import logging
import pickle
import shutil

import numpy as np
import pytest

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.integrations.tmrl.dataset import read_tmrl_dataset
from emote_core.integrations.tmrl.memory import TmrlMemory
from emote_core.stores.zarr_store import MemoryStore
from emote_core.typing import EpisodeState
from tests.integrations.tmrl.test_tmrl_episode_memory import Buffer, split_pendulum, worker_samples


def tmrl_transitions(lists):
    """What tmrl's GenericTorchMemory.get_transition returns for every item it keeps (the items
    whose entry is not a done), in item order: (last_obs, new_act, rew, new_obs, term, trunc)."""
    actions, observations, rewards, terminated, truncated, _, dones = lists
    return [
        (observations[i], actions[i + 1], rewards[i + 1], observations[i + 1],
         terminated[i + 1], truncated[i + 1])
        for i in range(len(actions) - 1)
        if not dones[i]
    ]  # fmt: skip


def assert_tmrl_transition(got, want):
    for position in (0, 3):
        for have, expected in zip(got[position], want[position], strict=True):
            np.testing.assert_array_equal(have, expected)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == np.float32(want[2]) and (got[4], got[5]) == (want[4], want[5])


@pytest.mark.parametrize("name", ["tmrl_pendulum.data.pkl", "tmrl_cartpole_mixed.data.pkl"])
def test_a_dataset_path_written_by_tmrl_gives_the_transitions_tmrl_would(data_file, tmp_path, name):
    folder = tmp_path / "dataset"
    folder.mkdir()
    shutil.copy(data_file(name), folder / "data.pkl")
    with open(folder / "data.pkl", "rb") as file:
        lists = pickle.load(file)
    memory = TmrlMemory(memory_size=10_000, batch_size=8, dataset_path=str(folder), seed=0)
    want = tmrl_transitions(lists)
    assert len(memory) == len(want) > 0
    for item, transition in enumerate(want):
        assert_tmrl_transition(memory.get_transition(item), transition)
    ends = [end for _, _, end in memory.table.episodes()]
    assert len(ends) == sum(map(bool, lists[6]))  # one episode per done
    assert len(memory.sample()[2]) == 8


def test_save_dataset_writes_what_tmrl_and_the_reader_load_back(tmp_path):
    samples = worker_samples("CartPole-v1", episodes=3, cap=30, seed=4)
    memory = TmrlMemory(memory_size=1000)
    memory.append(Buffer(samples[:-4]))  # the last episode still open
    written = memory.save_dataset(tmp_path / "out")
    assert written == tmp_path / "out" / "data.pkl"
    with open(written, "rb") as file:
        lists = pickle.load(file)
    assert [len(values) for values in lists] == [len(samples) - 4] * 7
    # The file holds exactly the worker's entries, in tmrl's seven-list layout.
    np.testing.assert_array_equal(lists[1], [s[1] for s in samples[:-4]])
    assert lists[3] == [bool(s[3]) for s in samples[:-4]] and lists[6][-1] is False
    again = TmrlMemory(memory_size=1000, dataset_path=tmp_path / "out", crc_debug=True)
    assert len(again) == len(memory)
    for item in range(len(memory)):
        have, want = again.get_transition(item), memory.get_transition(item)
        for field in range(6):
            np.testing.assert_array_equal(have[field], want[field])
        again[item]  # the infos came back too: crc_debug finds what the worker sent
    table = read_tmrl_dataset(tmp_path / "out")  # the folder, as tmrl's dataset_path
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [
        len(e) for e in (*[d["actions"] for _, d, _ in memory.table.episodes()],)
    ] + [len(memory.open_episode)]
    assert [s for _, _, s in table.episodes][:-1] == [EpisodeState.TERMINAL] * 2


def test_exported_episodes_make_a_store_that_verifies(runner, tmp_path):
    samples = worker_samples("Pendulum-v1", episodes=4, cap=15, observe=split_pendulum)
    memory = TmrlMemory(memory_size=1000)
    memory.append(Buffer(samples[:-5]))
    store = tmp_path / "tmrl.zarr"
    assert memory.export_zarr(store) == 3  # the open fourth episode is not exported
    result = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    assert result.exit_code == ExitCode.OK, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and (report["episodes"], report["transitions"]) == (3, 45)
    read = list(MemoryStore(str(store)).episodes())
    for (_, data, end), (_, held, held_end) in zip(read, memory.table.episodes(), strict=True):
        assert end == held_end == EpisodeState.INTERRUPTED
        for column in ("obs_0", "obs_1", "actions", "rewards"):
            np.testing.assert_array_equal(data[column], held[column])


def test_tmrl_arguments_are_accepted_and_an_empty_dataset_path_starts_empty(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="emote_core.integrations.tmrl.memory"):
        memory = TmrlMemory(
            memory_size=1e6, batch_size=256, dataset_path=str(tmp_path / "missing"), imgs_obs=4,
            act_buf_len=2, nb_steps=3, crc_debug=True, device="cpu",
        )  # fmt: skip
    assert len(memory) == 0 and memory.nb_steps == 3 and memory.memory_size == 1_000_000
    assert "imgs_obs=4 and act_buf_len=2 are not used" in caplog.text
    assert "no data found" in caplog.text
    with pytest.raises(Exception, match="no finished episode yet"):
        memory.export_zarr(tmp_path / "x.zarr")


def test_positional_calls_in_either_tmrl_order_fail_instead_of_shifting_arguments() -> None:
    from emote_core.integrations.tmrl.episode_memory import TmrlEpisodeMemory
    from emote_core.integrations.tmrl.memory import TmrlMemory

    # GenericTorchMemory(memory_size, batch_size, dataset_path, nb_steps, ...) and
    # MemoryTMLidar(memory_size, batch_size, dataset_path, imgs_obs, act_buf_len, nb_steps, ...).
    with pytest.raises(TypeError, match="positional"):
        TmrlMemory(1000, 32, "", 4)  # type: ignore[misc]
    # tmrl's Memory(device, nb_steps, sample_preprocessor, memory_size, batch_size, dataset_path).
    with pytest.raises(TypeError, match="positional"):
        TmrlEpisodeMemory("cpu", 1, None, 1000, 32, "")  # type: ignore[misc]
    assert TmrlMemory(1000, 32, "", nb_steps=3).nb_steps == 3
