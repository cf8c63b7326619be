"""WandbLogger with the real wandb package, offline: the run's files appear in the run directory
and hold what was logged. Skipped where wandb is not installed (the `wandb` extra)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from emote_core.callback import Callback
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.wandb_logger import (
    WANDB_INSTALL,
    WandbLogger,
    WandbNotInstalledError,
    start_wandb_run,
)
from emote_core.errors import ConfigurationError
from emote_core.trainer import Trainer


class Reporter(LoggingMixin, Callback):
    def __init__(self) -> None:
        super().__init__(name="reporter")

    def backward(self, bp_step: int) -> None:
        self.log_scalar("loss/q_for_wandb", 0.5 * bp_step)
        self.log_windowed_scalar("episode/reward_for_wandb", -float(bp_step))


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keeps wandb's settings and caches out of the user's home, and no mode forced."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    return tmp_path / "run"


def wait_for_wandb() -> None:
    """Waits until W&B's service has written everything, as it does when a process exits:
    run.finish() can return before the service's writer has flushed the run file."""
    import wandb

    wandb.teardown()


def start(directory: Path, **options: Any) -> Any:
    directory.mkdir(parents=True, exist_ok=True)
    arguments = dict(project="emote-tests", entity=None, mode="offline", name="unit",
                     config={"sac": {"learning_rate": 0.001}})  # fmt: skip
    return start_wandb_run(directory=directory, **(arguments | options))


def test_an_offline_run_is_written_into_the_run_directory(wandb_home: Path) -> None:
    run = start(wandb_home)
    reporter = Reporter()
    logger = WandbLogger(callbacks=[reporter], run=run, log_interval=5)
    logger.log_metrics({"eval/mean_return_for_wandb": 12.5}, 5)
    Trainer([reporter, logger], [{"batch_size": 2}] * 12).train()
    wait_for_wandb()

    (offline,) = (wandb_home / "wandb").glob("offline-run-*")
    (records,) = offline.glob("run-*.wandb")
    data = records.read_bytes()
    for key in (b"loss/q_for_wandb", b"episode/reward_for_wandb",
                b"episode/reward_for_wandb_cumulative", b"eval/mean_return_for_wandb",
                b"learning_rate"):  # fmt: skip
        assert key in data, key


def test_wandb_mode_in_the_environment_wins(
    wandb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = start(wandb_home)
    run.log({"x": 1.0}, step=1)
    run.finish()
    assert not list(wandb_home.glob("wandb/offline-run-*"))  # "offline" would have written one


def test_without_wandb_the_error_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ConfigurationError) as raised:
        start(tmp_path)
    message = str(raised.value)
    assert WANDB_INSTALL in message and "wandb" in message and "\n" not in message
    with pytest.raises(ImportError) as upstreams:  # upstream's call fails as upstream's did
        WandbLogger(callbacks=[], config={}, log_interval=1)
    assert isinstance(upstreams.value, WandbNotInstalledError) and upstreams.value.msg == message
    assert isinstance(upstreams.value.__cause__, ImportError)


def test_upstreams_config_starts_the_run_in_the_working_directory(
    wandb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb_home.mkdir(parents=True)
    monkeypatch.chdir(wandb_home)
    config = {"wandb_project": "emote-tests", "wandb_run": "upstream", "seed": 3}
    logger = WandbLogger(callbacks=[Reporter()], config=config, log_interval=5)
    try:
        assert logger.run.name == "upstream" and dict(logger.run.config) == {"seed": 3}
        assert list((wandb_home / "wandb").glob("offline-run-*"))
    finally:
        logger.run.finish()
    with pytest.raises(ConfigurationError, match=r"config has no \['wandb_run'\]"):
        WandbLogger(callbacks=[], config={"wandb_project": "p"}, log_interval=1)
    with pytest.raises(ConfigurationError, match="got both"):
        WandbLogger(callbacks=[], run=logger.run, config=config, log_interval=1)
