"""LoggingMixin: what callbacks and proxies log, kept until a logger callback writes it out."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError

_WINDOW_PREFIX = re.compile(r"^windowed\[(\d+)\]:(.+)$")

Loggable = float | int | np.ndarray | torch.Tensor


def _to_float(value: Loggable) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean().item()) if value.numel() != 1 else value.item()
    if isinstance(value, np.ndarray):
        return float(value.mean()) if value.size != 1 else float(value.reshape(()))
    return float(value)


def _to_array(value: Loggable | Iterable[float]) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class LoggingMixin:
    """Collects scalars, windowed scalars, cumulative sums, histograms, images and videos.

    Mixed into callbacks (``class MyLoss(LoggingMixin, Callback)``) and other objects that report
    values; a logger callback such as ``TensorboardLogger`` reads and writes them out.

    Windowed scalars keep the last ``default_window_length`` values of a key and are reported as
    their mean; a key spelled ``"windowed[N]:name"`` keeps ``N`` values for ``name`` instead. Every
    windowed value is also added to a cumulative sum per key.

    Args:
        default_window_length: How many values a windowed scalar keeps by default.
        **kwargs: Passed on to the next class (a callback's constructor, for example).
    """

    def __init__(self, *, default_window_length: int = 250, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if default_window_length < 1:
            raise ConfigurationError(
                f"default_window_length must be at least 1; got {default_window_length}"
            )
        self.default_window_length = default_window_length
        self.scalar_logs = {}
        self.windowed_scalar: dict[str, deque[float]] = {}
        self.windowed_scalar_cumulative: dict[str, float] = {}
        self.hist_logs: dict[str, np.ndarray] = {}
        self.image_logs: dict[str, np.ndarray] = {}
        self.video_logs: dict[str, tuple[np.ndarray, int]] = {}

    @property
    def scalar_logs(self) -> dict[str, float]:
        """The latest value of every scalar key.

        Values logged as CUDA tensors are kept on the device until read here, so logging never
        waits for the GPU (nor breaks a CUDA graph's capture); reading converts them all at once.
        """
        pending = self.__dict__.get("_pending_scalars")
        scalars: dict[str, float] = self.__dict__.setdefault("_scalar_logs", {})
        if pending:
            for key, value in pending.items():
                scalars[key] = _to_float(value)
            pending.clear()
        return scalars

    @scalar_logs.setter
    def scalar_logs(self, value: dict[str, float]) -> None:
        self.__dict__["_scalar_logs"] = dict(value)
        self.__dict__["_pending_scalars"] = {}

    def log_scalar(self, key: str, value: Loggable) -> None:
        """Records the latest value of ``key`` (a tensor or array is reduced to its mean).

        A CUDA tensor (or any tensor inside ``torch.compile``) is reduced where it is and
        converted when :attr:`scalar_logs` is read.
        """
        attributes = self.__dict__
        if type(value) is float:  # the common case (learning rates, targets): no conversion
            number = value
        elif isinstance(value, torch.Tensor):
            if not value.is_cpu or torch.compiler.is_compiling():
                attributes.setdefault("_pending_scalars", {})[key] = value.detach().float().mean()
                return
            number = value.item() if value.numel() == 1 else _to_float(value)
        else:
            number = _to_float(value)
        pending = attributes.get("_pending_scalars")
        if pending:
            pending.pop(key, None)
        # Not through the property: reading it would convert (and wait for) pending CUDA values.
        scalars = attributes.get("_scalar_logs")
        if scalars is None:
            scalars = attributes.setdefault("_scalar_logs", {})
        scalars[key] = number

    def log_windowed_scalar(self, key: str, value: Loggable | Iterable[float]) -> None:
        """Adds one value, or several, to ``key``'s window and cumulative sum.

        Args:
            key: The name, optionally ``"windowed[N]:name"`` to keep ``N`` values.
            value: A number, a tensor or array (each element is added), or a sequence of numbers.
        """
        match = _WINDOW_PREFIX.match(key)
        if match:
            length, key = int(match.group(1)), match.group(2)
            if length < 1:
                raise ConfigurationError(f"window length in '{match.group(0)}' must be >= 1")
        else:
            length = self.default_window_length
        window = self.windowed_scalar.get(key)
        if window is None or (match and window.maxlen != length):
            window = deque(window or (), maxlen=length)
            self.windowed_scalar[key] = window
        values = _to_array(value).astype(np.float64).ravel()
        window.extend(values.tolist())
        previous = self.windowed_scalar_cumulative.get(key, 0.0)
        self.windowed_scalar_cumulative[key] = previous + float(values.sum())

    def log_histogram(self, key: str, value: Loggable | Iterable[float]) -> None:
        """Records the values whose distribution to show for ``key``."""
        self.hist_logs[key] = _to_array(value).ravel()

    def log_image(self, key: str, image: Loggable) -> None:
        """Records an image, ``HWC`` with 1, 3 or 4 channels (uint8, or floats in [0, 1])."""
        array = _to_array(image)
        if array.ndim == 2:
            array = array[..., None]
        if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
            raise ConfigurationError(
                f"image '{key}' has shape {array.shape}; expected HWC with 1, 3 or 4 channels"
            )
        self.image_logs[key] = array

    def log_video(self, key: str, frames: Loggable, fps: int) -> None:
        """Records a video, ``THWC`` frames with 1 or 3 channels, shown at ``fps``."""
        array = _to_array(frames)
        if array.ndim != 4 or array.shape[-1] not in (1, 3):
            raise ConfigurationError(
                f"video '{key}' has shape {array.shape}; expected THWC with 1 or 3 channels"
            )
        if fps < 1:
            raise ConfigurationError(f"video '{key}' has fps={fps}; fps must be at least 1")
        self.video_logs[key] = (array, int(fps))

    def windowed_means(self) -> dict[str, float]:
        """The mean of every non-empty window, by key."""
        return {k: float(np.mean(w)) for k, w in self.windowed_scalar.items() if len(w) > 0}

    def state_dict(self) -> dict[str, Any]:
        """Adds the logged scalars, windows and sums to the next class's state."""
        parent = getattr(super(), "state_dict", None)
        state = dict(parent()) if parent is not None else {}
        state["logs"] = {
            "scalar_logs": dict(self.scalar_logs),
            "windowed_scalar": {k: list(w) for k, w in self.windowed_scalar.items()},
            "window_lengths": {k: w.maxlen for k, w in self.windowed_scalar.items()},
            "windowed_scalar_cumulative": dict(self.windowed_scalar_cumulative),
        }
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the logs saved by :meth:`state_dict`, then the next class's state."""
        parent = getattr(super(), "load_state_dict", None)
        if parent is not None:
            parent(state_dict, load_network, load_optimizer, load_hparams)
        logs = state_dict.get("logs")
        if logs is None:
            return
        self.scalar_logs = {k: float(v) for k, v in logs["scalar_logs"].items()}
        self.windowed_scalar = {
            k: deque(values, maxlen=logs["window_lengths"].get(k, self.default_window_length))
            for k, values in logs["windowed_scalar"].items()
        }
        self.windowed_scalar_cumulative = {
            k: float(v) for k, v in logs["windowed_scalar_cumulative"].items()
        }


__all__ = ["LoggingMixin"]
