"""`emote train --memory` refuses a store whose float columns hold NaN or inf (every loss would
turn NaN), in one line naming the column, the episode, the row and the count, unless
--allow-nonfinite is given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.integrations.convert import write_target
from emote_core.stores.zarr_store import MemoryStore


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    store = tmp_path_factory.mktemp("collected") / "pendulum.zarr"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["collect", "sac_pendulum", "--out", str(store), "--episodes", "2", "-q"]
    )
    assert result.exit_code == ExitCode.OK, result.output
    return store


@pytest.mark.parametrize(("column", "episode", "row"), [("rewards", 1, 7), ("obs", 0, 200)])
def test_training_on_nonfinite_values_is_refused_unless_allowed(
    runner, tmp_path, collected, column, episode, row
):
    stored = MemoryStore(collected).read()
    identity, data, _ = stored.episodes[episode]
    data[column] = np.array(data[column], copy=True)
    data[column][row] = np.nan
    poisoned = tmp_path / "poisoned.zarr"
    write_target(stored, poisoned)
    values = np.asarray(data[column][row]).size

    train = ["train", "sac_pendulum", "--memory", str(poisoned), "--no-live", "--steps", "1"]
    refused = runner.invoke(app, [*train, "--run-dir", str(tmp_path / "refused"), "-q"])
    assert refused.exit_code == ExitCode.ERROR, refused.output
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: store '{poisoned}': "), lines
    assert (
        f"column '{column}' holds {values} non-finite value{'s' * (values > 1)} (NaN or inf) in "
        f"1 episode, the first in episode {identity} at row {row};" in lines[0]
    ), lines[0]
    assert "--allow-nonfinite" in lines[0]
    assert not (tmp_path / "refused").exists()

    if column == "rewards":  # one training run shows the flag lets it through
        kept = runner.invoke(
            app, [*train, "--run-dir", str(tmp_path / "kept"), "-q", "--allow-nonfinite"]
        )
        assert kept.exit_code == ExitCode.OK, kept.output
