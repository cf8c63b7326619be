"""What LoggingMixin keeps, and that it survives a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.callback import Callback
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError


class Logged(LoggingMixin, Callback):
    pass


def test_scalars_reduce_tensors_and_arrays() -> None:
    logged = Logged(name="l")
    logged.log_scalar("a", torch.tensor(2.5))
    logged.log_scalar("b", np.array([1.0, 3.0]))
    logged.log_scalar("c", 4)
    assert logged.scalar_logs == {"a": 2.5, "b": 2.0, "c": 4.0}


def test_windows_keep_the_last_values_and_sum_all_of_them() -> None:
    logged = Logged(name="l", default_window_length=3)
    for value in range(10):
        logged.log_windowed_scalar("reward", value)
    logged.log_windowed_scalar("windowed[2]:short", [1.0, 5.0, 7.0])
    logged.log_windowed_scalar("batch", torch.tensor([1.0, 2.0]))
    assert list(logged.windowed_scalar["reward"]) == [7.0, 8.0, 9.0]
    assert logged.windowed_means() == {"reward": 8.0, "short": 6.0, "batch": 1.5}
    assert logged.windowed_scalar_cumulative == {"reward": 45.0, "short": 13.0, "batch": 3.0}


def test_bad_images_videos_and_windows_are_refused() -> None:
    logged = Logged(name="l")
    with pytest.raises(ConfigurationError, match="expected HWC"):
        logged.log_image("img", np.zeros((2, 3, 5, 7)))
    with pytest.raises(ConfigurationError, match="expected THWC"):
        logged.log_video("vid", np.zeros((4, 4, 3)), fps=10)
    with pytest.raises(ConfigurationError, match="fps must be at least 1"):
        logged.log_video("vid", np.zeros((2, 4, 4, 3)), fps=0)
    with pytest.raises(ConfigurationError, match="default_window_length"):
        Logged(name="l", default_window_length=0)
    logged.log_image("gray", np.zeros((4, 5)))
    assert logged.image_logs["gray"].shape == (4, 5, 1)


def test_state_round_trips_through_state_dict_and_weights_only_load(tmp_path) -> None:
    logged = Logged(name="l", default_window_length=4)
    for value in range(6):
        logged.log_windowed_scalar("reward", value)
    logged.log_windowed_scalar("windowed[2]:short", [3.0, 4.0, 5.0])
    logged.log_scalar("loss", 0.25)
    torch.save(logged.state_dict(), tmp_path / "state.tar")

    restored = Logged(name="l", default_window_length=4)
    restored.load_state_dict(torch.load(tmp_path / "state.tar", weights_only=True))
    assert restored.scalar_logs == {"loss": 0.25}
    assert restored.windowed_means() == logged.windowed_means()
    assert restored.windowed_scalar_cumulative == logged.windowed_scalar_cumulative
    restored.log_windowed_scalar("short", 9.0)  # the per-key window length survived
    assert list(restored.windowed_scalar["short"]) == [5.0, 9.0]


def test_logging_a_number_leaves_values_waiting_on_the_device_unconverted() -> None:
    """Converting a pending CUDA value waits for the GPU (and is illegal while a CUDA graph is
    recorded), so only reading ``scalar_logs`` converts; logging another key must not."""
    logs = LoggingMixin()
    waiting = torch.tensor([1.5, 2.5])
    logs.__dict__["_pending_scalars"] = {"loss": waiting}
    logs.log_scalar("lr", 3e-4)
    assert logs.__dict__["_pending_scalars"] == {"loss": waiting}
    assert logs.scalar_logs == {"loss": 2.0, "lr": pytest.approx(3e-4)}
    assert logs.__dict__["_pending_scalars"] == {}
    logs.log_scalar("loss", 7.0)  # a newer value replaces the pending one
    assert logs.scalar_logs["loss"] == 7.0


def test_a_value_logged_after_a_device_tensor_does_not_read_the_device_tensor() -> None:
    """Device (CUDA) scalars stay pending until the logs are read; logging a number after one,
    as a loss logs its learning rate after its loss, must not convert it (a host sync per step).
    A meta tensor stands in for a CUDA one: converting it would raise."""
    logged = Logged(name="l")
    logged.log_scalar("loss", torch.ones((), device="meta"))
    logged.log_scalar("lr", 0.5)
    logged.log_scalar("norm", torch.tensor(2.0))
    with pytest.raises(RuntimeError):
        logged.scalar_logs  # noqa: B018 - reading converts the pending meta value
    logged.log_scalar("loss", torch.tensor([1.0, 3.0]))  # a host value replaces the pending one
    assert logged.scalar_logs == {"lr": 0.5, "norm": 2.0, "loss": 2.0}
