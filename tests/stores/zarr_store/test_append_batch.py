"""ShardWriter.append_batch commits a collector's joined episodes as append commits the same
episodes one by one; a batch that does not fit is refused as the episodes would be, and nothing
is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import SchemaError
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.typing import EpisodeState

EXTRA_ROWS = {"obs": 1, "actions": 0, "rewards": 0}
FIELDS = ("id", "offset", "length", "end_state", "return", "checksum")


def new_store(kit, url: Path) -> str:
    columns = store_columns(kit.schemas, kit.make(1), "rewards")
    create_store(url, columns=columns, length_key="rewards")
    return str(url)


def test_a_joined_batch_is_stored_as_its_episodes_are(tmp_path: Path, kit) -> None:
    batches = [[kit.make(i) for i in range(12)], [kit.make(i) for i in range(12, 40)]]
    one_by_one, joined = new_store(kit, tmp_path / "a.zarr"), new_store(kit, tmp_path / "b.zarr")
    for episodes in batches:
        ShardWriter(one_by_one).append(episodes)
        ShardWriter(joined).append_batch(EpisodeBatch.of(episodes, EXTRA_ROWS))
    expected, got = MemoryStore(one_by_one), MemoryStore(joined)
    for name in FIELDS:
        np.testing.assert_array_equal(got.shards[0].table[name], expected.shards[0].table[name])
    records = list(got.episodes())  # each episode's checksum checked as it is read
    assert [r[0] for r in records] == list(range(40))
    for record in records:
        kit.check(record)


def test_a_batch_that_does_not_fit_is_refused_and_nothing_is_written(tmp_path: Path, kit) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    writer = ShardWriter(url)
    writer.append([kit.make(0)])
    episodes = [kit.make(i) for i in range(1, 5)]
    episodes[2] = (3, episodes[2][1], EpisodeState.RUNNING)  # unfinished: the episode checks
    with pytest.raises(SchemaError, match="episode 3 ends RUNNING"):
        writer.append_batch(EpisodeBatch.of(episodes, EXTRA_ROWS))
    wide = [(i, dict(data, actions=np.zeros((len(data["actions"]), 3), np.float32)), end)
            for i, data, end in episodes[:2]]  # fmt: skip
    with pytest.raises(SchemaError, match="column 'actions' of episode 1 has shape"):
        writer.append_batch(EpisodeBatch.of(wide, EXTRA_ROWS))
    assert MemoryStore(url).shards[0].episodes == 1
    writer.append_batch(EpisodeBatch.of([kit.make(i) for i in range(1, 3)], EXTRA_ROWS))
    assert [r[0] for r in MemoryStore(url).episodes()] == [0, 1, 2]
