"""`emote train --set memory.sampler=prioritized`: SAC and DQN train end to end with prioritized
replay, their TD errors become the memory's priorities, beta anneals in TensorBoard, and a
resumed run starts from the checkpoint's priorities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpointing import load_checkpoint

PRIORITIZED = ("--set", "memory.sampler=prioritized", "--threads", "1")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def saved_priorities(run: Path, step: int) -> dict[int, torch.Tensor]:
    state = load_checkpoint(run / "checkpoints" / f"checkpoint_{step}.tar")
    saved = state["callbacks"]["priorities"]["priorities"]
    episodes = saved["values"].split(saved["lengths"].tolist())
    return dict(zip(saved["identities"].tolist(), episodes, strict=True))


def test_sac_trains_with_prioritized_replay_and_resumes_with_its_priorities(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    result = runner.invoke(
        app,
        ["train", "sac_hit_the_middle", "--steps", "200", "--run-dir", "r", "-q", *PRIORITIZED,
         "--set", "training.log_interval=50", "--set", "memory.priority_beta=0.5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    priorities = saved_priorities(in_tmp / "r", 200)
    values = torch.cat(list(priorities.values()))
    # New transitions start at the largest priority so far; sampled ones took their TD error.
    assert len(values.unique()) > 100
    assert (values < values.max()).float().mean() > 0.5

    events = ea.EventAccumulator(str(in_tmp / "r" / "tensorboard"))
    events.Reload()
    beta = [event.value for event in events.Scalars("training_bp_step/priority_beta")]
    assert beta[0] == pytest.approx(0.5 + 0.5 * 49 / 200) and beta == sorted(beta)
    assert beta[-1] == pytest.approx(0.5 + 0.5 * 199 / 200)

    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "r", "--steps", "201"])
    assert resumed.exit_code == 0, resumed.output
    held = len(priorities)
    assert f"restored the priorities of {held} of the {held} episodes saved" in resumed.stderr
    after = saved_priorities(in_tmp / "r", 201)
    # One update of 256 windows later, most transitions keep the priority they were saved with.
    same = [torch.isclose(after[i], p) for i, p in priorities.items()]
    assert torch.cat(same).float().mean() > 0.5


def test_dqn_trains_with_prioritized_replay(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    result = runner.invoke(
        app,
        ["train", "dqn_cartpole", "--steps", "200", "--run-dir", "r", "-q", *PRIORITIZED,
         "--set", "memory.warmup_steps=200", "--set", "training.log_interval=100",
         "--set", "memory.priority_beta_final=0.4"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    values = torch.cat(list(saved_priorities(in_tmp / "r", 200).values()))
    assert len(values.unique()) > 100
    events = ea.EventAccumulator(str(in_tmp / "r" / "tensorboard"))
    events.Reload()
    beta = [event.value for event in events.Scalars("training_bp_step/priority_beta")]
    assert beta == pytest.approx([0.4, 0.4])  # beta_final = beta: constant
    assert "training_bp_step/mean_abs_td_error" in events.Tags()["scalars"]


def test_priority_settings_without_the_prioritized_sampler_are_refused(
    runner: CliRunner, in_tmp: Path
) -> None:
    refused = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "5", "--set", "memory.priority_beta=0.6"]
    )
    assert refused.exit_code == 2
    assert "'memory.priority_beta' = 0.6 is a setting of prioritized replay" in refused.stderr
