"""Run memory on disk: MemoryExporterProxyWrapper appends live episodes to a store, and
MemoryImporterCallback reads an export (a store or an upstream zip) back into a table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emote_core.callback import Order
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.integrations.upstream import store_table
from emote_core.integrations.upstream.importer import MemoryImporterCallback
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.memory.wrappers import MemoryTableProxyWrapper
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.stores.memory_export import MemoryExporterProxyWrapper
from emote_core.stores.zarr_store import MemoryStore
from emote_core.trainer import Trainer
from emote_core.typing import DictObservation, DictResponse, EpisodeState

INITIAL, RUNNING = EpisodeState.INITIAL, EpisodeState.RUNNING
TERMINAL, INTERRUPTED = EpisodeState.TERMINAL, EpisodeState.INTERRUPTED


SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (1,)),
    state=DictSpace({"obs": BoxSpace(np.float32, (2,))}),
)


def make_table() -> DictObsMemoryTable:
    return DictObsMemoryTable(spaces=SPACES, maxlen=10_000, seed=1)


def obs(state, reward=None, value: float = 0.0) -> DictObservation:
    rewards = {} if reward is None else {"reward": reward}
    return DictObservation(
        episode_state=state, array_data={"obs": np.full(2, value, np.float32)}, rewards=rewards
    )


def act() -> DictResponse:
    return DictResponse({"actions": np.ones(1, np.float32)})


def feed_episode(proxy, agent: int, length: int, base: float = 0.0) -> None:
    """``length`` transitions ending TERMINAL; observation and reward t are ``base + t``."""
    proxy.add({agent: obs(INITIAL, value=base)}, {agent: act()})
    for t in range(1, length):
        proxy.add({agent: obs(RUNNING, base + t, base + t)}, {agent: act()})
    proxy.add({agent: obs(TERMINAL, base + length, base + length)}, {})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_importer_fails_clearly_when_the_export_is_missing(tmp_path):
    table = make_table()
    importer = MemoryImporterCallback(
        memory=table, target_memory_name="replay", experiment_load_dir=tmp_path
    )
    assert importer.order == Order.DATA
    with pytest.raises(CheckpointError, match=r"replay.*replay_export") as caught:
        Trainer([importer], [{"batch_size": 1}]).train()
    assert str(tmp_path) in str(caught.value) and table.size() == 0


def test_exported_memory_is_restored_by_the_importer_in_the_next_run(tmp_path):
    table = make_table()
    exporter = MemoryExporterProxyWrapper(
        MemoryTableProxy(table),
        target_memory_name="replay",
        inf_steps_per_memory_export=5,
        experiment_root_path=tmp_path,
        min_time_per_export=0.0,
    )
    feed_episode(exporter, agent=0, length=4, base=0.0)  # 4 agent steps
    feed_episode(exporter, agent=1, length=2, base=100.0)  # exported at its INITIAL (step 5)
    assert exporter.export_count == 1 and table.episode_count == 2

    fresh = make_table()
    importer = MemoryImporterCallback(
        memory=fresh, target_memory_name="replay", experiment_load_dir=tmp_path
    )
    Trainer([importer], [{"batch_size": 1}]).train()
    # The export is the table as it was at step 5: the first episode only.
    [(identity, data, end)] = list(fresh.episodes())
    [(identity_, data_, end_), _] = list(table.episodes())
    assert (identity, end) == (identity_, end_) and fresh.size() == 4
    for key in ("obs", "actions", "rewards"):
        np.testing.assert_array_equal(data[key], data_[key])
    batch = fresh.sample_by_index([identity], [0], 4)
    np.testing.assert_array_equal(batch["masks"].numpy()[:, 0], [1, 1, 1, 0])


def test_importer_reads_an_override_file_name(tmp_path):
    table = make_table()
    proxy = MemoryTableProxy(table)
    feed_episode(proxy, agent=0, length=3)
    store_table(proxy.table, tmp_path / "hand_made")

    fresh = make_table()
    MemoryImporterCallback(
        memory=fresh,
        target_memory_name="replay",
        experiment_load_dir=tmp_path,
        load_fname_override="hand_made",
    ).restore_state()
    assert fresh.size() == 3 and fresh.episode_count == 1


def test_exporter_exports_every_n_agent_steps_and_at_most_once_per_min_time(tmp_path, monkeypatch):
    table = make_table()
    clock = Clock()
    exporter = MemoryExporterProxyWrapper(
        MemoryTableProxy(table),
        target_memory_name="replay",
        inf_steps_per_memory_export=4,
        experiment_root_path=tmp_path / "run",
        min_time_per_export=10.0,
        clock=clock,
    )
    exports: list[tuple[Path, int]] = []
    export = exporter.export

    def recording_export() -> Path:  # records what the store holds after each export
        path = export()
        exports.append((path, MemoryStore(path).transition_count))
        return path

    monkeypatch.setattr(exporter, "export", recording_export)
    exporter.add({0: obs(INITIAL), 1: obs(INITIAL)}, {0: act(), 1: act()})  # 2 agent steps
    exporter.add({0: obs(RUNNING, 1.0)}, {0: act()})  # 3
    exporter.add({0: obs(TERMINAL, 1.0)}, {})  # final observations take no action: still 3
    assert exports == []
    exporter.add({1: obs(RUNNING, 1.0)}, {1: act()})  # 4: the first export is due
    assert exports == [(tmp_path / "run" / "replay_export", 2)]
    assert (tmp_path / "run").is_dir()

    for _ in range(6):  # 6 more steps, but within min_time_per_export of the first export
        exporter.add({1: obs(RUNNING, 1.0)}, {1: act()})
    assert len(exports) == 1
    clock.now += 10.0
    exporter.add({1: obs(RUNNING, 1.0)}, {1: act()})
    assert len(exports) == 2 and exporter.export_count == 2
    clock.now += 100.0
    for _ in range(3):  # time has passed, but only 3 steps since the last export
        exporter.add({1: obs(RUNNING, 1.0)}, {1: act()})
    assert len(exports) == 2
    exporter.add({1: obs(INTERRUPTED, 1.0)}, {})
    exporter.add({1: obs(INITIAL)}, {1: act()})
    assert len(exports) == 3 and exports[-1][1] == 2 + 12  # both finished episodes
    assert MemoryStore(exports[-1][0]).episode_count == 2  # appended, never rewritten
    assert proxy_timer_count(exporter, "export") == 3


def proxy_timer_count(wrapper: MemoryTableProxyWrapper, name: str) -> int:
    return int(wrapper.timers.stats()[name]["count"])


def test_exporter_rejects_bad_settings(tmp_path):
    proxy = MemoryTableProxy(make_table())
    with pytest.raises(ConfigurationError, match="inf_steps_per_memory_export"):
        MemoryExporterProxyWrapper(
            proxy,
            target_memory_name="m",
            inf_steps_per_memory_export=0,
            experiment_root_path=tmp_path,
        )
    with pytest.raises(ConfigurationError, match="min_time_per_export"):
        MemoryExporterProxyWrapper(
            proxy,
            target_memory_name="m",
            inf_steps_per_memory_export=1,
            experiment_root_path=tmp_path,
            min_time_per_export=-1,
        )


def test_the_export_records_its_spaces_env_and_who_wrote_it(tmp_path):
    from emote_core.stores.inspect import store_provenance
    from emote_core.stores.provenance import PolicyKind, PolicyRecord, Provenance

    run = PolicyRecord(PolicyKind.TRAINING, str(tmp_path))
    who = Provenance(command=("emote", "train", "r"), env_id="emote/HitTheMiddle-v0", policy=run)
    exporter = MemoryExporterProxyWrapper(
        MemoryTableProxy(make_table()), target_memory_name="memory",
        inf_steps_per_memory_export=1, experiment_root_path=tmp_path, min_time_per_export=0.0,
        spaces=SPACES.to_json(), provenance=who,
    )  # fmt: skip
    feed_episode(exporter, agent=0, length=3)
    exporter.export()  # as FinalMemoryExport does when training ends
    exporter.close()

    store = MemoryStore(tmp_path / "memory_export")
    assert MDPSpace.from_json(store.spaces) == SPACES
    report = store_provenance(store)
    assert report["env_id"] == "emote/HitTheMiddle-v0"
    (session,) = report["shards"]["main"]
    assert session["command"] == ["emote", "train", "r"]
    assert session["policy"] == {"kind": "training", "path": str(tmp_path), "sha256": None}
    assert session["episodes"] == 1


def test_whole_episodes_count_their_steps_towards_the_next_export(tmp_path):
    exporter = MemoryExporterProxyWrapper(
        MemoryTableProxy(make_table()), target_memory_name="replay",
        inf_steps_per_memory_export=5, experiment_root_path=tmp_path / "run",
        min_time_per_export=0.0,
    )  # fmt: skip
    assert exporter.accepts_episodes

    def episode(length: int) -> dict[str, np.ndarray]:
        return {
            "obs": np.arange(2 * (length + 1), dtype=np.float32).reshape(length + 1, 2),
            "actions": np.ones((length, 1), np.float32),
            "rewards": np.ones(length, np.float32),
        }

    exporter.add_episode(episode(3), TERMINAL)  # 3 steps: no export yet
    assert exporter.export_count == 0
    exporter.add_episode(episode(2), INTERRUPTED)  # 5: both go out
    assert exporter.export_count == 1
    store = MemoryStore(tmp_path / "run" / "replay_export")
    assert (store.episode_count, store.transition_count) == (2, 5)
