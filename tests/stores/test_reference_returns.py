"""Reference returns kept in a store's root: written atomically beside the other attributes,
read back from a path or an open store, and refused when they could not scale a score."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import ConfigurationError, FormatError
from emote_core.stores.provenance import (
    ReferenceReturns,
    reference_returns,
    set_reference_returns,
)
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, create_store, store_columns
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def new_store(path: Path) -> Path:
    steps = np.ones((3, 1), np.float32)
    first = (0, {"obs": np.zeros((4, 2), np.float32), "actions": steps, "rewards": steps},
             EpisodeState.TERMINAL)  # fmt: skip
    create_store(path, columns=store_columns(SCHEMAS, first, "rewards"), length_key="rewards",
                 env_id="Pendulum-v1")  # fmt: skip
    return path


def test_reference_returns_round_trip_and_leave_every_other_attribute_as_it_was(tmp_path):
    store = new_store(tmp_path / "s.zarr")
    before = json.loads((store / "zarr.json").read_text())["attributes"]
    assert reference_returns(store) is None

    set_reference_returns(store, random=-1200, expert=-150.5, source="emote eval, 10 episodes")
    expected = ReferenceReturns(-1200.0, -150.5, "emote eval, 10 episodes")
    assert reference_returns(store) == expected
    assert reference_returns(str(store)) == expected
    assert reference_returns(MemoryStore(store)) == expected
    after = json.loads((store / "zarr.json").read_text())["attributes"]
    assert after.pop("reference_returns") == {
        "random": -1200.0, "expert": -150.5, "source": "emote eval, 10 episodes"
    }  # fmt: skip
    assert after == before
    assert sorted(p.name for p in store.iterdir()) == ["shards", "zarr.json"]  # no temporaries

    set_reference_returns(store, random=0.0, expert=10.0, source="again")  # replaces
    assert reference_returns(store) == ReferenceReturns(0.0, 10.0, "again")


def test_the_normalised_score_is_0_for_random_and_100_for_expert():
    references = ReferenceReturns(random=-1200.0, expert=-200.0, source="s")
    assert references.normalised_score(-1200.0) == 0.0
    assert references.normalised_score(-200.0) == 100.0
    assert references.normalised_score(-700.0) == pytest.approx(50.0)
    assert references.normalised_score(-100.0) == pytest.approx(110.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"random": math.nan, "expert": 1.0}, "'random' must be finite; got nan"),
        ({"random": 0.0, "expert": math.inf}, "'expert' must be finite; got inf"),
        ({"random": 5.0, "expert": 5}, "'random' and 'expert' are both 5.0; they must differ"),
        ({"random": 0.0, "expert": 1.0, "source": "two\nlines"}, "'source' must be one line"),
        ({"random": 0.0, "expert": 1.0, "source": " "}, "'source' must be one line"),
    ],
)
def test_values_that_cannot_scale_a_score_are_refused_and_nothing_is_written(
    tmp_path, values, message
):
    store = new_store(tmp_path / "s.zarr")
    before = (store / "zarr.json").read_bytes()
    with pytest.raises(ConfigurationError, match=message) as raised:
        set_reference_returns(store, **{"source": "measured", **values})
    assert len(str(raised.value).splitlines()) == 1
    assert (store / "zarr.json").read_bytes() == before


def test_only_emote_stores_take_them_and_a_damaged_record_is_named(tmp_path):
    with pytest.raises(FormatError, match="no emote memory store"):
        set_reference_returns(tmp_path / "none.zarr", random=0, expert=1, source="s")
    assert not (tmp_path / "none.zarr").exists()

    store = new_store(tmp_path / "s.zarr")
    document = json.loads((store / "zarr.json").read_text())
    document["attributes"]["reference_returns"] = {"random": 0.0, "source": "s"}
    (store / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(FormatError, match="'reference_returns' attribute is malformed"):
        reference_returns(store)
