"""TensorboardLogger and TerminalLogger, run in a real Trainer and read back from event files."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from torch.utils.tensorboard import SummaryWriter

from emote_core.callback import Callback
from emote_core.callbacks import logging as logging_module
from emote_core.callbacks.logging import TensorboardLogger, TerminalLogger, tag_for
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.trainer import Trainer

BATCH_SIZE = 4
STEPS = 20
INTERVAL = 5
CYCLES = [5, 10, 15, 20]
WINDOW = 4
IMAGE_STEP = 3
VIDEO_SHAPE = (5, 6, 8, 3)  # THWC


def image_at(bp_step: int) -> np.ndarray:
    image = np.zeros((6, 10, 3), dtype=np.uint8)
    image[..., 0] = bp_step * 10
    return image


def video_at(bp_step: int) -> np.ndarray:
    frames = np.zeros(VIDEO_SHAPE, dtype=np.uint8)
    for t in range(VIDEO_SHAPE[0]):  # distinct frames, so the GIF keeps all of them
        frames[t, :, : t + 1, 1] = 200
        frames[t, 0, 0, 2] = bp_step
    return frames


class Reporter(LoggingMixin, Callback):
    """Logs values derived from the step number, so tests know what each cycle must show."""

    def __init__(self, *, video_steps: tuple[int, ...] = ()) -> None:
        super().__init__(default_window_length=WINDOW, name="reporter")
        self.video_steps = video_steps

    def backward(self, bp_step: int) -> None:
        self.log_scalar("loss/q", 0.5 * bp_step)
        self.log_scalar("lr", 1e-3 / bp_step)
        self.log_windowed_scalar("training/reward", float(bp_step))
        self.log_windowed_scalar("windowed[3]:training/short", 2.0 * bp_step)
        self.log_histogram("weights/q", np.arange(bp_step, dtype=np.float64))
        if bp_step == IMAGE_STEP:
            self.log_image("render/frame", image_at(bp_step))
        if bp_step in self.video_steps:
            self.log_video("video/clip", video_at(bp_step), fps=10)


class Boom(Callback):
    def backward(self, bp_step: int) -> None:
        if bp_step == 7:
            raise RuntimeError("boom at step 7")


def batches(count: int = STEPS) -> list[dict[str, Any]]:
    return [{"batch_size": BATCH_SIZE}] * count


def read_events(logdir: Path) -> ea.EventAccumulator:
    guidance = {
        ea.SCALARS: 0,
        ea.HISTOGRAMS: 0,
        ea.IMAGES: 0,
        ea.COMPRESSED_HISTOGRAMS: 0,
        ea.AUDIO: 0,
        ea.TENSORS: 0,
    }
    accumulator = ea.EventAccumulator(str(logdir), size_guidance=guidance)
    accumulator.Reload()
    return accumulator


def scalar_series(events: ea.EventAccumulator, tag: str) -> tuple[list[int], list[float]]:
    scalars = events.Scalars(tag)
    return [s.step for s in scalars], [s.value for s in scalars]


def train_with_tensorboard(
    logdir: Path, reporter: Reporter | None = None, **logger_kwargs: Any
) -> tuple[Reporter, SummaryWriter, ea.EventAccumulator]:
    reporter = reporter or Reporter()
    writer = SummaryWriter(log_dir=str(logdir))
    logger = TensorboardLogger(
        callbacks=[reporter], writer=writer, log_interval=INTERVAL, **logger_kwargs
    )
    Trainer([logger, reporter], batches()).train()
    return reporter, writer, read_events(logdir)


def test_tag_names_put_the_counter_into_the_first_part() -> None:
    assert tag_for("loss/q1", "bp_step") == "loss_bp_step/q1"
    assert tag_for("loss/q1", "bp_samples") == "loss_bp_samples/q1"
    assert tag_for("reward", "bp_step") == "reward_bp_step"
    assert tag_for("a/b/c", "bp_step") == "a_bp_step/b/c"


def test_scalars_are_written_each_cycle_against_bp_step(tmp_path: Path) -> None:
    _, writer, events = train_with_tensorboard(tmp_path)

    tags = set(events.Tags()["scalars"])
    assert {"loss_bp_step/q", "lr_bp_step"} <= tags
    assert not any(tag.split("/")[0].endswith("_bp_samples") for tag in tags)
    steps, values = scalar_series(events, "loss_bp_step/q")
    assert steps == CYCLES
    assert values == pytest.approx([0.5 * s for s in CYCLES])
    steps, values = scalar_series(events, "lr_bp_step")
    assert steps == CYCLES
    assert values == pytest.approx([1e-3 / s for s in CYCLES], rel=1e-6)
    assert writer.all_writers is None, "the writer must be closed at end_training"


def test_log_by_samples_also_writes_against_bp_samples(tmp_path: Path) -> None:
    _, _, events = train_with_tensorboard(tmp_path, log_by_samples=True)

    steps, values = scalar_series(events, "loss_bp_samples/q")
    assert steps == [BATCH_SIZE * s for s in CYCLES]
    assert values == pytest.approx([0.5 * s for s in CYCLES])
    steps, _ = scalar_series(events, "loss_bp_step/q")
    assert steps == CYCLES
    assert "training_bp_samples/reward_cumulative" in events.Tags()["scalars"]


def test_windowed_means_and_cumulative_sums(tmp_path: Path) -> None:
    _, _, events = train_with_tensorboard(tmp_path)

    rewards = np.arange(1, STEPS + 1, dtype=np.float64)
    steps, means = scalar_series(events, "training_bp_step/reward")
    assert steps == CYCLES
    assert means == pytest.approx([rewards[:s][-WINDOW:].mean() for s in CYCLES])
    steps, sums = scalar_series(events, "training_bp_step/reward_cumulative")
    assert steps == CYCLES
    assert sums == pytest.approx([rewards[:s].sum() for s in CYCLES])

    # windowed[3]: overrides the default window of 4 for this key only
    _, short_means = scalar_series(events, "training_bp_step/short")
    assert short_means == pytest.approx([(2 * rewards[:s])[-3:].mean() for s in CYCLES])
    _, short_sums = scalar_series(events, "training_bp_step/short_cumulative")
    assert short_sums == pytest.approx([(2 * rewards[:s]).sum() for s in CYCLES])


class EpisodeReporter(Reporter):
    """Finishes an episode of return ``-bp_step`` each step, after 7 env steps per update."""

    def __init__(self) -> None:
        super().__init__()
        self.env_steps = 0

    def backward(self, bp_step: int) -> None:
        super().backward(bp_step)
        self.env_steps += 7
        self.log_windowed_scalar("episode/reward", -float(bp_step))


def test_episode_metrics_are_also_written_against_env_steps(tmp_path: Path) -> None:
    reporter = EpisodeReporter()
    _, _, events = train_with_tensorboard(tmp_path, reporter, env_steps=lambda: reporter.env_steps)

    rewards = -np.arange(1, STEPS + 1, dtype=np.float64)
    steps, means = scalar_series(events, "episode_env_step/reward")
    assert steps == [7 * s for s in CYCLES]  # the collector's count, not the update count
    assert means == pytest.approx([rewards[:s][-WINDOW:].mean() for s in CYCLES])
    assert scalar_series(events, "episode_bp_step/reward")[1] == pytest.approx(means)
    # Only the episode metrics get the second axis.
    assert not any(
        tag.split("/")[0].endswith("_env_step") and not tag.startswith("episode_")
        for tag in events.Tags()["scalars"]
    )


def test_histograms_each_cycle_and_images_once(tmp_path: Path) -> None:
    reporter, _, events = train_with_tensorboard(tmp_path)

    histograms = events.Histograms("weights_bp_step/q")
    assert [h.step for h in histograms] == CYCLES
    for event in histograms:  # the histogram logged last in each cycle: arange(bp_step)
        assert event.histogram_value.num == event.step
        assert event.histogram_value.min == 0
        assert event.histogram_value.max == event.step - 1

    # The image logged at step 3 is written at the first cycle and then forgotten.
    images = events.Images("render_bp_step/frame")
    assert [i.step for i in images] == [INTERVAL]
    assert (images[0].height, images[0].width) == image_at(IMAGE_STEP).shape[:2]
    assert reporter.image_logs == {} and reporter.hist_logs == {}
    assert "loss/q" in reporter.scalar_logs and "training/reward" in reporter.windowed_scalar


def test_throughput_is_logged_every_cycle(tmp_path: Path) -> None:
    _, _, events = train_with_tensorboard(tmp_path)

    steps, steps_per_sec = scalar_series(events, "performance_bp_step/bp_steps_per_sec")
    assert steps == CYCLES  # the first cycle is measured from begin_training
    assert all(v > 0 for v in steps_per_sec)
    _, samples_per_sec = scalar_series(events, "performance_bp_step/bp_samples_per_sec")
    ratios = [
        samples / steps for samples, steps in zip(samples_per_sec, steps_per_sec, strict=True)
    ]
    assert ratios == pytest.approx([BATCH_SIZE] * len(CYCLES), rel=1e-5)


def test_writer_is_flushed_and_closed_when_a_callback_raises(tmp_path: Path) -> None:
    reporter = Reporter()
    writer = SummaryWriter(log_dir=str(tmp_path))
    logger = TensorboardLogger(callbacks=[reporter], writer=writer, log_interval=INTERVAL)

    with pytest.raises(RuntimeError, match="boom at step 7"):
        Trainer([logger, reporter, Boom()], batches()).train()

    assert writer.all_writers is None
    steps, _ = scalar_series(read_events(tmp_path), "loss_bp_step/q")
    assert steps == [5, 7]  # what was logged up to the failing step is kept for the post-mortem


def test_unwritable_histograms_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class BadHistogram(Reporter):
        def backward(self, bp_step: int) -> None:
            super().backward(bp_step)
            self.log_histogram("weights/broken", np.array([1.0, np.nan]))

    with caplog.at_level(logging.WARNING, logger="emote_core.callbacks.logging"):
        _, _, events = train_with_tensorboard(tmp_path, reporter=BadHistogram())

    assert "weights_bp_step/broken" not in events.Tags()["histograms"]
    assert "weights_bp_step/q" in events.Tags()["histograms"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(CYCLES)
    assert "weights/broken" in warnings[0] and "non-finite" in warnings[0]


def test_videos_are_written_as_animated_gifs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pil_image = pytest.importorskip("PIL.Image", reason="Pillow comes with the dev extra")
    monkeypatch.setattr(
        logging_module, "_detect_video_encoder", lambda: logging_module._VideoEncoder.PILLOW
    )
    reporter, _, events = train_with_tensorboard(tmp_path, reporter=Reporter(video_steps=(3, 12)))

    videos = events.Images("video_bp_step/clip")
    assert [v.step for v in videos] == [5, 15]
    frames, height, width, _ = VIDEO_SHAPE
    gif = pil_image.open(io.BytesIO(videos[0].encoded_image_string))
    assert gif.format == "GIF"
    assert gif.n_frames == frames
    assert gif.size == (width, height)
    assert reporter.video_logs == {}


def test_videos_go_to_add_video_as_ntchw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class RecordingWriter(SummaryWriter):
        def __init__(self, log_dir: str) -> None:
            super().__init__(log_dir=log_dir)
            self.videos: list[tuple[str, np.ndarray, int, int]] = []

        def add_video(
            self,
            tag: str,
            vid_tensor: Any,
            global_step: int | None = None,
            fps: int = 4,
            walltime: float | None = None,
        ) -> None:
            self.videos.append((tag, np.asarray(vid_tensor), global_step or 0, fps))

    monkeypatch.setattr(
        logging_module, "_detect_video_encoder", lambda: logging_module._VideoEncoder.MOVIEPY
    )
    writer = RecordingWriter(str(tmp_path))
    reporter = Reporter(video_steps=(3,))
    logger = TensorboardLogger(
        callbacks=[reporter], writer=writer, log_interval=INTERVAL, log_by_samples=True
    )
    Trainer([logger, reporter], batches()).train()

    assert [(tag, step, fps) for tag, _, step, fps in writer.videos] == [
        ("video_bp_step/clip", 5, 10),
        ("video_bp_samples/clip", 20, 10),
    ]
    tensor = writer.videos[0][1]
    t, h, w, c = VIDEO_SHAPE
    assert tensor.shape == (1, t, c, h, w)
    np.testing.assert_array_equal(tensor[0], video_at(3).transpose(0, 3, 1, 2))


def test_videos_are_skipped_with_one_warning_without_an_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        logging_module, "_detect_video_encoder", lambda: logging_module._VideoEncoder.MISSING
    )
    with caplog.at_level(logging.WARNING, logger="emote_core.callbacks.logging"):
        reporter, _, events = train_with_tensorboard(
            tmp_path, reporter=Reporter(video_steps=(3, 8, 12))
        )

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "video" in warnings[0].getMessage()
    assert not any(tag.startswith("video") for tag in events.Tags()["images"])
    assert reporter.video_logs == {}
    assert scalar_series(events, "loss_bp_step/q")[0] == CYCLES  # training went on


@pytest.mark.parametrize("log_interval", [0, -5, 2.5, True])
def test_loggers_reject_a_bad_log_interval(tmp_path: Path, log_interval: Any) -> None:
    with pytest.raises(ConfigurationError, match="log_interval"):
        TerminalLogger(callbacks=[Reporter()], log_interval=log_interval)
    writer = SummaryWriter(log_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="log_interval"):
        TensorboardLogger(callbacks=[Reporter()], writer=writer, log_interval=log_interval)
    writer.close()


def test_loggers_reject_callbacks_that_do_not_log(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="LoggingMixin"):
        TerminalLogger(callbacks=[Boom()], log_interval=5)  # type: ignore[list-item]
    writer = SummaryWriter(log_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="LoggingMixin"):
        TensorboardLogger(callbacks=[Boom()], writer=writer, log_interval=5)  # type: ignore[list-item]
    writer.close()


def test_terminal_logger_logs_one_sorted_line_per_cycle(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    reporter = Reporter()
    logger = TerminalLogger(callbacks=[reporter], log_interval=INTERVAL)

    with caplog.at_level(logging.INFO, logger="emote_core.callbacks.logging"):
        Trainer([logger, reporter], batches()).train()

    lines = [r.getMessage() for r in caplog.records if r.name == "emote_core.callbacks.logging"]
    assert len(lines) == len(CYCLES)
    # step 5: loss 2.5, lr 1e-3/5, reward window mean(2..5), short window mean(6, 8, 10)
    assert lines[0] == (
        "bp_step 5 | loss/q 2.5 | lr 0.0002 | training/reward 3.5 | training/short 8"
    )
    assert lines[-1] == (
        "bp_step 20 | loss/q 10 | lr 5e-05 | training/reward 18.5 | training/short 38"
    )
    assert capsys.readouterr().out == ""


def test_terminal_logger_log_scalars_reports_at_a_given_step_with_a_suffix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reporter = Reporter()
    for bp_step in (1, 2):
        reporter.backward(bp_step)
    logger = TerminalLogger(callbacks=[reporter], log_interval=INTERVAL)

    with caplog.at_level(logging.INFO, logger="emote_core.callbacks.logging"):
        logger.log_scalars(8)
        logger.log_scalars(8, suffix="bp_samples")

    lines = [r.getMessage() for r in caplog.records if r.name == "emote_core.callbacks.logging"]
    assert lines == [
        "bp_step 8 | loss/q 1 | lr 0.0005 | training/reward 1.5 | training/short 3",
        "bp_samples 8 | loss_bp_samples/q 1 | lr_bp_samples 0.0005 "
        "| training_bp_samples/reward 1.5 | training_bp_samples/short 3",
    ]


def test_steps_after_the_last_cycle_are_written_at_end_training(tmp_path: Path) -> None:
    reporter = Reporter()
    writer = SummaryWriter(log_dir=str(tmp_path))
    logger = TensorboardLogger(callbacks=[reporter], writer=writer, log_interval=INTERVAL)
    Trainer([logger, reporter], batches(12)).train()
    steps, values = scalar_series(read_events(tmp_path), "loss_bp_step/q")
    assert steps == [5, 10, 12]
    assert values == pytest.approx([2.5, 5.0, 6.0])
