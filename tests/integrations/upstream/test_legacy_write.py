"""Writing upstream's Legacy zip: deprecated as upstream's, read back by emote's safe reader."""

from __future__ import annotations

import stat
import sys
import zipfile

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.upstream import (
    TableSerializationVersion,
    read_table_file,
    restore_table,
    store_table,
)
from emote_core.memory.strategies import PrioritizedSampleStrategy
from emote_core.typing import EpisodeState


def _episode(identity: int, length: int) -> dict[str, np.ndarray]:
    base = float(identity)
    return {
        "actions": np.full((length, 2), base, np.float32),
        "rewards": np.arange(length, dtype=np.float32)[:, None] + base,
        "obs": np.arange((length + 1) * 3, dtype=np.float32).reshape(-1, 3) + base,
        "terminal": np.float32(identity % 2),
    }


def _plain(table):
    return [
        (i, e, {k: np.asarray(v).tolist() for k, v in d.items()}) for i, d, e in table.episodes()
    ]


def test_legacy_is_upstreams_spelling_of_the_same_member():
    assert TableSerializationVersion.Legacy is TableSerializationVersion.LEGACY
    assert TableSerializationVersion(0) is TableSerializationVersion.LEGACY


def test_a_legacy_zip_round_trips_with_deprecation_warnings(legacy_table, tmp_path):
    table = legacy_table()
    for identity, length in ((4, 3), (-7, 2), (9, 5)):
        table.add_sequence(identity, _episode(identity, length))
    path = tmp_path / "memory.zip"
    with pytest.deprecated_call(match="Legacy memory export"):
        store_table(table, path, TableSerializationVersion.Legacy)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by all, as upstream's
    with zipfile.ZipFile(path) as archive:
        assert b"emote.memory.column" in archive.read("data.pickle")

    restored = legacy_table()
    with pytest.deprecated_call(match="Legacy"):
        restore_table(restored, path)
    assert _plain(restored) == _plain(table)
    with pytest.deprecated_call():
        stored = read_table_file(path)
    assert stored.format == "emote-legacy" and stored.ejector_type == "FifoEjectionStrategy"
    kinds = {c.name: c.mapper for c in stored.columns}
    assert kinds["next_obs"] == {"type": "NextElementMapper", "n": 1}
    assert kinds["masks"] == {"type": "SyntheticMasks"}
    assert "emote" not in sys.modules  # upstream's names were written, never imported


def test_interrupted_episodes_warn_that_they_read_back_terminal(legacy_table, tmp_path):
    table = legacy_table()
    table.add_sequence(1, _episode(1, 2), end_state=EpisodeState.INTERRUPTED)
    with pytest.deprecated_call(), pytest.warns(UserWarning, match="1 INTERRUPTED"):
        store_table(table, tmp_path / "m.zip", TableSerializationVersion.LEGACY)


def test_what_the_legacy_format_cannot_name_is_refused(legacy_table, tmp_path):
    table = legacy_table()
    table.sampler = PrioritizedSampleStrategy()
    with pytest.deprecated_call(), pytest.raises(FormatError, match="PrioritizedSampleStrategy"):
        store_table(table, tmp_path / "m.zip", TableSerializationVersion.LEGACY)
    assert not (tmp_path / "m.zip").exists()
