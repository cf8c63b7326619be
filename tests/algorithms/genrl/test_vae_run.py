"""A ``genrl_sac`` recipe's ``vae_run``: its run files are read only when they are files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emote_core.algorithms.genrl.family import read_vae_config
from emote_core.errors import ConfigurationError, FormatError


def test_a_vae_run_whose_run_json_is_a_pipe_or_a_device_is_refused_not_read(
    tmp_path: Path, no_hang: None
) -> None:
    (tmp_path / "recipe.toml").write_text('algorithm = "genrl_vae"\n[genrl_vae]\n')
    record = tmp_path / "run.json"
    record.write_text("{}")
    assert read_vae_config(str(tmp_path)) is not None  # the run as emote wrote it reads
    record.unlink()
    os.mkfifo(record)  # reading it would wait for a writer forever
    with pytest.raises(FormatError, match=r"run\.json' is not a file \(mode p"):
        read_vae_config(str(tmp_path))
    record.unlink()
    record.symlink_to("/dev/zero")  # reading it would never end
    with pytest.raises(FormatError, match=r"run\.json' is not a file \(mode c"):
        read_vae_config(str(tmp_path))
    record.unlink()
    with pytest.raises(ConfigurationError, match="is not an emote run directory"):
        read_vae_config(str(tmp_path))
