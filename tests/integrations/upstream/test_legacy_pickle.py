"""The older legacy .pickle dump: split at dones, INTERRUPTED tails, refused payloads."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError, UnsafePickleError
from emote_core.integrations.upstream import read_legacy_pickle_episodes, restore_table
from emote_core.integrations.upstream.legacy_pickle import restore_legacy_pickle
from emote_core.typing import EpisodeState

STEPS = 7
DONES = (2, 4)  # episodes: steps 0-2 and 3-4 end TERMINAL; steps 5-6 are a tail without a done


def _dump(path: Path, protocol: int = 4, **overrides) -> Path:
    """A dump of STEPS steps x 1 env x 1 agent; step t observes 10 t and then 10 t + 5."""
    steps = np.arange(STEPS, dtype=np.float64)
    state = {
        "obs": np.repeat(10 * steps, 3).reshape(STEPS, 1, 1, 3) + np.arange(3),
        "next_obs": np.repeat(10 * steps + 5, 3).reshape(STEPS, 1, 1, 3) + np.arange(3),
        "actions": np.stack([steps, -steps], axis=1).reshape(STEPS, 1, 2),  # one dim fewer
        "rewards": (steps + 0.5).reshape(STEPS, 1, 1),
        "dones": np.isin(np.arange(STEPS), DONES).reshape(STEPS, 1, 1),
    }
    state.update(overrides)
    path.write_bytes(pickle.dumps(state, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_dump_splits_into_episodes_at_dones_with_an_interrupted_tail(tmp_path, protocol):
    episodes = read_legacy_pickle_episodes(_dump(tmp_path / "memory.pickle", protocol))

    assert [(identity, end) for identity, _, end in episodes] == [
        (0, EpisodeState.TERMINAL),
        (1, EpisodeState.TERMINAL),
        (2, EpisodeState.INTERRUPTED),
    ]
    first, second, tail = (data for _, data, _ in episodes)
    assert first["obs"][:, 0].tolist() == [0.0, 10.0, 20.0, 25.0]  # ends with next_obs[2]
    assert second["obs"][:, 0].tolist() == [30.0, 40.0, 45.0]
    assert tail["obs"][:, 0].tolist() == [50.0, 60.0, 65.0]
    assert first["actions"].tolist() == [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]]
    assert tail["rewards"].tolist() == [5.5, 6.5]
    assert first["obs"].shape == (4, 3) and first["actions"].shape == (3, 2)


def test_a_dump_restores_into_a_table_with_terminal_and_interrupted_masks(tmp_path, dump_table):
    table = dump_table()
    restore_table(table, _dump(tmp_path / "memory.pickle"))

    assert [len(data["actions"]) for _, data, _ in table.episodes()] == [3, 2, 2]
    batch = table.sample_all()
    assert batch["dones"].reshape(-1).tolist() == [0, 0, 1, 0, 1, 0, 1]
    assert batch["masks"].reshape(-1).tolist() == [1, 1, 0, 1, 0, 1, 1]  # the tail bootstraps
    assert batch["next_obs"][:, 0].tolist() == [10, 20, 25, 40, 45, 60, 65]
    assert batch["rewards"].dtype == batch["obs"].dtype  # float64 file values cast to float32


def test_a_dump_without_the_pickle_suffix_is_recognised_by_content(tmp_path, dump_table):
    table = dump_table()
    restore_table(table, _dump(tmp_path / "memory.bin"))
    assert table.episode_count == 3


def test_table_columns_can_be_mapped_to_dump_fields(tmp_path, fixture_table):
    table = fixture_table()  # scalar "observation" and "reward" columns
    path = _dump(tmp_path / "memory.pickle", obs=np.arange(STEPS, dtype=np.float64))
    path.write_bytes(
        pickle.dumps({**pickle.loads(path.read_bytes()), "next_obs": np.arange(STEPS) + 0.5})
    )
    restore_legacy_pickle(table, path, fields={"observation": "obs", "reward": "rewards"})
    assert [data["observation"].tolist() for _, data, _ in table.episodes()] == [
        [0.0, 1.0, 2.0, 2.5],
        [3.0, 4.0, 4.5],
        [5.0, 6.0, 6.5],
    ]


def test_columns_the_dump_cannot_fill_are_named(tmp_path, fixture_table, table_snapshot):
    table = fixture_table()
    table.add_sequence(4, {"observation": np.zeros(3), "reward": np.ones(2)})
    before = table_snapshot(table)
    with pytest.raises(FormatError, match=r"column 'observation' has no counterpart"):
        restore_table(table, _dump(tmp_path / "memory.pickle"))
    assert table_snapshot(table) == before


def test_disagreeing_step_counts_are_refused(tmp_path, dump_table, table_snapshot):
    table = dump_table()
    table.add_sequence(
        8, {"obs": np.zeros((2, 3)), "actions": np.zeros((1, 2)), "rewards": np.zeros((1, 1))}
    )
    before = table_snapshot(table)
    path = _dump(tmp_path / "memory.pickle", rewards=np.zeros((STEPS - 1, 1, 1)))
    with pytest.raises(FormatError, match=r"'dones' has 7 steps.*'rewards': 6"):
        restore_table(table, path)
    assert table_snapshot(table) == before


class _RunShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize(
    ("payload", "global_name"),
    [(_RunShell, f"'{os.system.__module__}.system'"), (_Eval, "'builtins.eval'")],
)
def test_a_hostile_dump_is_refused_before_it_runs(
    tmp_path, dump_table, table_snapshot, payload, global_name
):
    marker = tmp_path / "payload-ran"
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps({"obs": payload(marker), "dones": np.zeros(3)}))
    table = dump_table()
    table.add_sequence(
        8, {"obs": np.zeros((2, 3)), "actions": np.zeros((1, 2)), "rewards": np.zeros((1, 1))}
    )
    before = table_snapshot(table)
    with pytest.raises(UnsafePickleError, match=global_name):
        restore_table(table, path)
    with pytest.raises(UnsafePickleError, match=global_name):
        read_legacy_pickle_episodes(path)
    assert not marker.exists()
    assert table_snapshot(table) == before
