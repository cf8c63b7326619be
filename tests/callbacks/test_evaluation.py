"""Evaluator in a real Trainer: TensorBoard event files read back, best.tar written by a real
Checkpointer and loaded back, the end-of-training report."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard import SummaryWriter

from emote_core.callback import Callback
from emote_core.callbacks.checkpointing import (
    BEST_CHECKPOINT_NAME,
    Checkpointer,
    CheckpointLoader,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
)
from emote_core.callbacks.evaluation import HPARAM_METRIC, Evaluator
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError
from emote_core.trainer import Trainer

ENV_STEPS_PER_UPDATE = 3


class Counter(Callback):
    """Stands in for a collector: counts env steps and has a state to checkpoint."""

    def __init__(self) -> None:
        super().__init__(name="counter")
        self.env_steps = 0

    def begin_batch(self) -> None:
        self.env_steps += ENV_STEPS_PER_UPDATE

    def state_dict(self) -> dict[str, Any]:
        return {"env_steps": self.env_steps}

    def load_state_dict(self, state_dict: dict[str, Any], *args: Any) -> None:
        self.env_steps = state_dict["env_steps"]


class ScriptedEpisodes:
    """Plays no env: the n-th evaluation returns the n-th scripted mean (two episodes)."""

    def __init__(self, means: list[float]) -> None:
        self.means = list(means)
        self.calls = 0

    def __call__(self) -> dict[str, Any]:
        mean = self.means[self.calls]
        self.calls += 1
        return {"returns": [mean - 1.0, mean + 1.0], "lengths": [10, 20], "mean_return": mean}


def batches(count: int = 100) -> list[dict[str, Any]]:
    return [{"batch_size": 4}] * count


def read_events(logdir: Path) -> ea.EventAccumulator:
    events = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0})
    events.Reload()
    return events


def train(
    run_dir: Path,
    evaluate: ScriptedEpisodes,
    *,
    steps: int,
    interval: int,
    resume: bool = False,
    extra: list[Callback] | None = None,
    **options: Any,
) -> tuple[Evaluator, list[dict[str, Any]]]:
    counter = Counter()
    checkpointer = Checkpointer(callbacks=[counter], run_dir=run_dir, checkpoint_interval=10)
    reports: list[dict[str, Any]] = []
    writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
    evaluator = Evaluator(
        evaluate=evaluate, interval=interval, writer=writer,
        env_steps=lambda: counter.env_steps, checkpointer=checkpointer,
        write_report=reports.append, **options,
    )  # fmt: skip
    callbacks = [counter, checkpointer, evaluator, BackPropStepsTerminator(bp_steps=steps)]
    if resume:
        callbacks.append(CheckpointLoader(callbacks=[counter], run_dir=run_dir))
    Trainer(callbacks + (extra or []), batches()).train()
    writer.close()
    return evaluator, reports


def test_evaluations_go_to_tensorboard_against_updates_and_env_steps(tmp_path: Path) -> None:
    episodes = ScriptedEpisodes([1.0, 3.0, 2.0])
    train(tmp_path, episodes, steps=30, interval=10)

    events = read_events(tmp_path / "tensorboard")
    by_update = events.Scalars("eval_bp_step/mean_return")
    assert [e.step for e in by_update] == [10, 20, 30]
    assert [e.value for e in by_update] == pytest.approx([1.0, 3.0, 2.0])
    by_env_step = events.Scalars("eval_env_step/mean_return")
    assert [e.step for e in by_env_step] == [10 * ENV_STEPS_PER_UPDATE, 60, 90]
    assert [e.value for e in by_env_step] == pytest.approx([1.0, 3.0, 2.0])
    assert [e.value for e in events.Scalars("eval_bp_step/lowest_return")] == [0.0, 2.0, 1.0]
    assert [e.value for e in events.Scalars("eval_bp_step/mean_length")] == [15.0] * 3
    assert episodes.calls == 3  # the final step's evaluation is not played twice


def test_best_tar_is_the_best_evaluation_and_never_the_latest_checkpoint(tmp_path: Path) -> None:
    train(tmp_path, ScriptedEpisodes([1.0, 3.0, 2.0]), steps=30, interval=10)

    best = tmp_path / "checkpoints" / BEST_CHECKPOINT_NAME
    saved = load_checkpoint(best)  # the checkpoint format: eval, export and collect load it
    assert saved["bp_step"] == 20
    assert saved["callbacks"]["counter"] == {"env_steps": 60}
    assert saved["callbacks"]["evaluation"]["best"]["mean_return"] == 3.0
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10, 20, 30]
    assert load_latest_checkpoint(tmp_path)[0].name == "checkpoint_30.tar"
    assert CheckpointLoader(callbacks=[], run_dir=tmp_path).resolve().name == "checkpoint_30.tar"


def test_a_resumed_run_keeps_the_best_of_its_earlier_start(tmp_path: Path) -> None:
    train(tmp_path, ScriptedEpisodes([1.0, 5.0]), steps=20, interval=10)

    _, reports = train(tmp_path, ScriptedEpisodes([4.0, 6.0]), steps=40, interval=10, resume=True)
    best = load_checkpoint(tmp_path / "checkpoints" / BEST_CHECKPOINT_NAME)
    assert best["bp_step"] == 40  # 4.0 at step 30 did not replace 5.0; 6.0 at 40 did
    assert reports[-1]["best"]["bp_step"] == 40 and reports[-1]["best"]["mean_return"] == 6.0

    train(tmp_path, ScriptedEpisodes([0.0]), steps=50, interval=10, resume=True)
    assert load_checkpoint(tmp_path / "checkpoints" / BEST_CHECKPOINT_NAME)["bp_step"] == 40


def test_the_final_report_has_the_spread_the_threshold_and_whether_it_passed(
    tmp_path: Path,
) -> None:
    _, reports = train(tmp_path, ScriptedEpisodes([1.0, 2.5]), steps=15, interval=10,
                       min_return=2.0)  # fmt: skip
    (report,) = reports
    assert report["source"] == "training"
    assert (report["bp_step"], report["env_steps"]) == (15, 15 * ENV_STEPS_PER_UPDATE)
    assert report["mean_return"] == 2.5 and report["std_return"] == 1.0
    assert (report["lowest_return"], report["highest_return"]) == (1.5, 3.5)
    assert report["threshold"] == 2.0 and report["passed"] is True
    assert report["best"]["bp_step"] == 15

    _, reports = train(tmp_path / "b", ScriptedEpisodes([1.0]), steps=5, interval=0,
                       min_return=2.0)  # fmt: skip
    assert reports[0]["passed"] is False and reports[0]["bp_step"] == 5


def test_the_hyperparameters_are_written_with_the_final_return(tmp_path: Path) -> None:
    hparams = {"sac.learning_rate": 0.001, "env.id": "Pendulum-v1", "memory.store": True}
    train(tmp_path, ScriptedEpisodes([1.0, 7.5]), steps=12, interval=10, hparams=hparams)

    events = read_events(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in events.Scalars(HPARAM_METRIC)] == [(12, 7.5)]
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    values = start.session_start_info.hparams
    assert values["sac.learning_rate"].number_value == pytest.approx(0.001)
    assert values["env.id"].string_value == "Pendulum-v1"
    assert values["memory.store"].number_value == 1  # torch writes booleans as numbers
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    assert [m.name.tag for m in experiment.experiment.metric_infos] == [HPARAM_METRIC]


class Fail(Callback):
    def backward(self, bp_step: int) -> None:
        if bp_step == 7:
            raise RuntimeError("boom at step 7")


class CtrlC(Callback):
    def end_batch(self, bp_step: int, shutdown_signal: threading.Event) -> None:
        if bp_step == 7:
            shutdown_signal.set()


@pytest.mark.parametrize("ending", [Fail, CtrlC])
def test_no_final_evaluation_after_an_error_or_an_interruption(
    tmp_path: Path, ending: type[Callback]
) -> None:
    episodes = ScriptedEpisodes([1.0])
    try:
        _, reports = train(tmp_path, episodes, steps=20, interval=0, extra=[ending()])
    except RuntimeError as error:
        assert "boom" in str(error)
        reports = []
    assert episodes.calls == 0 and reports == []


@pytest.mark.parametrize("interval", [-1, 2.5, True])
def test_a_bad_interval_is_refused(interval: Any) -> None:
    with pytest.raises(ConfigurationError, match="interval"):
        Evaluator(evaluate=ScriptedEpisodes([]), interval=interval)
