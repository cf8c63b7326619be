"""Logger callbacks: write what :class:`LoggingMixin` objects collected to TensorBoard or the log.

Both loggers run at :attr:`Order.LOGGING`, after the losses of the same step have logged, once
every ``log_interval`` steps (their ``cycle``).

TensorBoard tags put the counter they are plotted against into the first part of the key, so that
TensorBoard groups the curves by counter: a key ``"loss/q1"`` becomes ``"loss_bp_step/q1"`` at
global step ``bp_step`` (and ``"loss_bp_samples/q1"`` at global step ``bp_samples`` when logging by
samples too); a key without a slash, ``"k"``, becomes ``"k_bp_step"``. Episode metrics
(``episode/...``) are also plotted against environment steps when the logger is told how many
there were: ``"episode_env_step/reward"`` at global step ``env_steps``.
"""

from __future__ import annotations

import enum
import importlib
import io
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import Summary

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.utils.checks import positive_int

log = logging.getLogger(__name__)

STEPS_PER_SECOND_KEY = "performance/bp_steps_per_sec"
"""The key under which :class:`TensorboardLogger` reports its training steps per second."""
SAMPLES_PER_SECOND_KEY = "performance/bp_samples_per_sec"
"""The key under which :class:`TensorboardLogger` reports its training samples per second."""


def tag_for(key: str, counter: str) -> str:
    """The TensorBoard tag for ``key`` plotted against ``counter`` (``bp_step``, ``bp_samples``).

    Args:
        key: The logged key, such as ``"loss/q1"`` or ``"reward"``.
        counter: The name of the global-step counter.

    Returns:
        ``"loss_<counter>/q1"`` for a key with a slash (split at the first one), else
        ``"reward_<counter>"``.
    """
    head, slash, tail = key.partition("/")
    return f"{head}_{counter}{slash}{tail}"


def check_loggers(callbacks: Iterable[Any], logger_name: str) -> list[LoggingMixin]:
    """``callbacks`` as a list if each mixes in :class:`LoggingMixin`, which a logger reads."""
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, LoggingMixin):
            raise ConfigurationError(
                f"logger '{logger_name}' got {callback!r} ({type(callback).__name__}) among its "
                "callbacks; it can only read objects that mix in "
                "emote_core.callbacks.logging_mixin.LoggingMixin"
            )
    return callbacks


class _VideoEncoder(enum.Enum):
    """How videos reach the event file; chosen once per logger, on its first video."""

    MOVIEPY = "moviepy"
    """``SummaryWriter.add_video``, which encodes GIFs with ``moviepy.editor`` (moviepy < 2)."""
    PILLOW = "pillow"
    """The same animated-GIF image summary, encoded with Pillow."""
    MISSING = "missing"
    """Neither is importable: videos are skipped after one warning."""


def _detect_video_encoder() -> _VideoEncoder:
    # torch's add_video imports moviepy.editor, which moviepy 2 removed; without it torch prints
    # a notice to stdout and writes an empty summary, so look before calling it.
    for module, encoder in (
        ("moviepy.editor", _VideoEncoder.MOVIEPY),
        ("PIL.Image", _VideoEncoder.PILLOW),
    ):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        return encoder
    return _VideoEncoder.MISSING


def _gif_summary(tag: str, frames: np.ndarray, fps: int) -> Summary:
    """Encodes THWC frames as the animated-GIF image summary that ``add_video`` writes."""
    from PIL import Image

    scale = 1 if frames.dtype == np.uint8 else 255
    frames = (frames.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)
    _, height, width, channels = frames.shape
    mode = "L" if channels == 1 else "RGB"
    images = [Image.fromarray(frame[..., 0] if channels == 1 else frame, mode) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(
        buffer,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
    )
    image = Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=buffer.getvalue()
    )
    return Summary(value=[Summary.Value(tag=tag, image=image)])


class TensorboardLogger(Callback):
    """Writes the logs of :class:`LoggingMixin` callbacks to TensorBoard every ``log_interval``.

    Each cycle it writes every scalar, the mean and cumulative sum (``<key>_cumulative``) of
    every windowed scalar, histograms, images (HWC) and videos (THWC, as GIF), and its own
    ``performance/bp_steps_per_sec`` and ``performance/bp_samples_per_sec``. Histograms, images
    and videos are written once and removed; without moviepy below 2 or Pillow, videos are
    skipped with one warning. ``end_training`` closes the writer, however training ends.

    Args:
        callbacks: The objects whose logs to write.
        writer: Where to write; closed at the end of training.
        log_interval: Write every this many training steps.
        log_by_samples: Also write every value against ``bp_samples``.
        env_steps: The environment steps collected so far (a collector's count); keys that start
            with one of ``env_step_prefixes`` are also written against it.
        env_step_prefixes: Which keys ``env_steps`` applies to (the episode metrics by default).
        name: The callback's name.

    Raises:
        ConfigurationError: If ``log_interval`` is not a positive integer or an entry of
            ``callbacks`` is not a :class:`LoggingMixin`.
    """

    order = Order.LOGGING

    def __init__(
        self,
        *,
        callbacks: list[LoggingMixin],
        writer: SummaryWriter,
        log_interval: int,
        log_by_samples: bool = False,
        env_steps: Callable[[], int] | None = None,
        env_step_prefixes: Sequence[str] = ("episode/",),
        name: str = "tensorboard_logger",
    ) -> None:
        log_interval = positive_int(f"logger '{name}'", "log_interval", log_interval)
        super().__init__(name=name, cycle=log_interval)
        self.callbacks = check_loggers(callbacks, name)
        self.writer = writer
        self.log_interval = log_interval
        self.log_by_samples = log_by_samples
        self.env_steps = env_steps
        self.env_step_prefixes = tuple(env_step_prefixes)
        self._env_step: int | None = None
        self._video_encoder: _VideoEncoder | None = None
        self._last_time: float | None = None
        self._last_bp_step = 0
        self._last_bp_samples = 0

    def begin_training(self, bp_step: int, bp_samples: int) -> None:
        """Starts the throughput clock."""
        self._restart_clock(bp_step, bp_samples)

    def end_cycle(self, bp_step: int, bp_samples: int) -> None:
        """Writes every callback's logs and this logger's throughput, then flushes."""
        steps: dict[str, int] = {"bp_step": bp_step}
        if self.log_by_samples:
            steps["bp_samples"] = bp_samples
        self._env_step = self.env_steps() if self.env_steps is not None else None

        self._write_throughput(bp_step, bp_samples, steps)
        for callback in self.callbacks:
            for key, value in callback.scalar_logs.items():
                self._add_scalar(key, value, steps)
            for key, mean in callback.windowed_means().items():
                self._add_scalar(key, mean, steps)
            for key, total in callback.windowed_scalar_cumulative.items():
                self._add_scalar(f"{key}_cumulative", total, steps)
            for key, values in callback.hist_logs.items():
                self._add_histogram(key, values, steps)
            for key, image in callback.image_logs.items():
                for counter, step in steps.items():
                    self.writer.add_image(tag_for(key, counter), image, step, dataformats="HWC")
            for key, (frames, fps) in callback.video_logs.items():
                self._add_video(key, frames, fps, steps)
            callback.hist_logs.clear()
            callback.image_logs.clear()
            callback.video_logs.clear()
        self.writer.flush()

    def end_training(self, bp_step: int, bp_samples: int) -> None:
        """Writes the logs of steps after the last cycle, then flushes and closes the writer."""
        try:
            if bp_step > self._last_bp_step:
                self.end_cycle(bp_step, bp_samples)
            self.writer.flush()
        finally:
            self.writer.close()

    def _restart_clock(self, bp_step: int, bp_samples: int) -> None:
        self._last_time = time.perf_counter()
        self._last_bp_step = bp_step
        self._last_bp_samples = bp_samples

    def _write_throughput(self, bp_step: int, bp_samples: int, steps: dict[str, int]) -> None:
        now = time.perf_counter()
        if self._last_time is not None and bp_step > self._last_bp_step:
            elapsed = max(now - self._last_time, 1e-9)
            steps_per_sec = (bp_step - self._last_bp_step) / elapsed
            samples_per_sec = (bp_samples - self._last_bp_samples) / elapsed
            self._add_scalar(STEPS_PER_SECOND_KEY, steps_per_sec, steps)
            self._add_scalar(SAMPLES_PER_SECOND_KEY, samples_per_sec, steps)
        self._last_time = now
        self._last_bp_step = bp_step
        self._last_bp_samples = bp_samples

    def _add_scalar(self, key: str, value: float, steps: dict[str, int]) -> None:
        for counter, step in steps.items():
            self.writer.add_scalar(tag_for(key, counter), value, step)
        if self._env_step is not None and key.startswith(self.env_step_prefixes):
            self.writer.add_scalar(tag_for(key, "env_step"), value, self._env_step)

    def _add_histogram(self, key: str, values: np.ndarray, steps: dict[str, int]) -> None:
        # np.histogram cannot bin empty or non-finite data; one bad histogram should not end a
        # long run, but it must not pass unnoticed either.
        if values.size == 0 or not np.all(np.isfinite(values)):
            problem = "no values" if values.size == 0 else "non-finite values"
            log.warning(
                "histogram '%s' at bp_step %d has %s; it was not written",
                key,
                steps["bp_step"],
                problem,
            )
            return
        for counter, step in steps.items():
            self.writer.add_histogram(tag_for(key, counter), values, step)

    def _add_video(self, key: str, frames: np.ndarray, fps: int, steps: dict[str, int]) -> None:
        if self._video_encoder is None:
            self._video_encoder = _detect_video_encoder()
            if self._video_encoder is _VideoEncoder.MISSING:
                log.warning(
                    "logger '%s' cannot write videos: it needs moviepy<2 or Pillow to encode "
                    "them; videos are skipped (install Pillow to see them)",
                    self.name,
                )
        if self._video_encoder is _VideoEncoder.MISSING:
            return
        for counter, step in steps.items():
            tag = tag_for(key, counter)
            if self._video_encoder is _VideoEncoder.MOVIEPY:
                # SummaryWriter wants NTCHW: one video of T frames with channels first.
                self.writer.add_video(tag, frames.transpose(0, 3, 1, 2)[None], step, fps=fps)
            else:
                # SummaryWriter has no public way to add a prepared summary; this is what
                # add_video itself calls.
                self.writer._get_file_writer().add_summary(_gif_summary(tag, frames, fps), step)


class TerminalLogger(Callback):
    """Logs one line of scalars and windowed means every ``log_interval`` training steps.

    The line goes to the ``emote_core.callbacks.logging`` logger at INFO level, keys sorted, for
    example ``bp_step 1000 | loss/q1 0.231 | training/lr 0.0003``.

    Args:
        callbacks: The objects whose logs to report.
        log_interval: Report every this many training steps.
        name: The callback's name.

    Raises:
        ConfigurationError: If ``log_interval`` is not a positive integer or an entry of
            ``callbacks`` is not a :class:`LoggingMixin`.
    """

    order = Order.LOGGING

    def __init__(
        self, *, callbacks: list[LoggingMixin], log_interval: int, name: str = "terminal_logger"
    ) -> None:
        log_interval = positive_int(f"logger '{name}'", "log_interval", log_interval)
        super().__init__(name=name, cycle=log_interval)
        self.callbacks = check_loggers(callbacks, name)
        self.log_interval = log_interval

    def log_scalars(self, step: int, suffix: str | None = None) -> None:
        """Logs one line of the callbacks' scalars and windowed means at ``step``.

        This is upstream emote's method, which :meth:`end_cycle` calls with the training step.

        Args:
            step: The counter value to report the line at.
            suffix: The counter's name, ``"bp_step"`` if not given. When given, it is also added
                to the first part of each key as TensorBoard tags have it (:func:`tag_for`):
                ``"loss/q1"`` with ``suffix="bp_samples"`` is logged as ``"loss_bp_samples/q1"``.
        """
        values: dict[str, float] = {}
        for callback in self.callbacks:
            values.update(callback.scalar_logs)
            values.update(callback.windowed_means())
        if suffix is not None:
            values = {tag_for(key, suffix): value for key, value in values.items()}
        parts = [f"{suffix or 'bp_step'} {step}"]
        parts += [f"{key} {values[key]:.4g}" for key in sorted(values)]
        log.info(" | ".join(parts))

    def end_cycle(self, bp_step: int) -> None:
        """Logs the line for this cycle."""
        self.log_scalars(bp_step)


__all__ = [
    "SAMPLES_PER_SECOND_KEY",
    "STEPS_PER_SECOND_KEY",
    "TensorboardLogger",
    "TerminalLogger",
    "tag_for",
]
