"""OnnxExporter publishing: ``exports/latest.onnx`` replaced in one rename at every publication,
with the update it was published at in its metadata; readers never see a half-written file."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from emote_core.algorithms.sac import SoftActorCritic
from emote_core.callback import Callback, Order
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError, ExportError
from emote_core.nn import GaussianMlpPolicy
from emote_core.onnx import exporter as exporter_module
from emote_core.onnx.exporter import LATEST_POLICY, OnnxExporter
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
    state=DictSpace({"pos": BoxSpace(np.float32, (3,))}),
)


def make_exporter(directory: Path, **kwargs) -> tuple[GaussianMlpPolicy, OnnxExporter]:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(8,))
    exporter = OnnxExporter(
        graph=functools.partial(SoftActorCritic().policy_graph, policy, SPACES),
        directory=directory, **kwargs,
    )  # fmt: skip
    return policy, exporter


def published_step(path: Path) -> int:
    """Loads the file in onnxruntime, runs it once, and returns its training step."""
    session = onnxruntime.InferenceSession(str(path))
    feeds = {
        i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
        for i in session.get_inputs()
    }
    session.run(None, feeds)
    return int(session.get_modelmeta().custom_metadata_map["training_step"])


class Updates(Callback):
    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__(name="updates")
        self.policy = policy

    def backward(self) -> None:
        with torch.no_grad():
            for parameter in self.policy.parameters():
                parameter.add_(1e-3)


class Reader(Callback):
    """Reads the published file after every update, as a collector would."""

    order = Order.TEST_CHECK

    def __init__(self, path: Path) -> None:
        super().__init__(name="reader")
        self.path = path
        self.seen: list[tuple[int, int | None]] = []

    def end_batch(self, bp_step: int) -> None:
        self.seen.append((bp_step, published_step(self.path) if self.path.exists() else None))


def batches():
    while True:
        yield {"batch_size": 1}


def test_the_policy_is_published_every_n_updates_and_when_training_ends(tmp_path: Path) -> None:
    policy, exporter = make_exporter(tmp_path / "exports", publish_interval=4)
    reader = Reader(tmp_path / "exports" / LATEST_POLICY)
    callbacks = [Updates(policy), exporter, reader, BackPropStepsTerminator(bp_steps=10)]
    Trainer(callbacks, batches()).train()
    assert dict(reader.seen) == {
        1: None, 2: None, 3: None, 4: 4, 5: 4, 6: 4, 7: 4, 8: 8, 9: 8, 10: 8
    }  # fmt: skip
    assert published_step(tmp_path / "exports" / LATEST_POLICY) == 10  # the final weights
    assert exporter.published_step == 10
    # Only the published file: no versioned exports (no interval), no temporary left behind.
    assert [p.name for p in (tmp_path / "exports").iterdir()] == [LATEST_POLICY]


def test_a_reader_sees_the_old_file_whole_while_the_new_one_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exports = tmp_path / "exports"
    _, exporter = make_exporter(exports, publish_interval=2, interval=4)
    exporter.begin_training(bp_step=0)
    exporter.end_batch(bp_step=2)
    latest = exports / LATEST_POLICY
    assert published_step(latest) == 2

    written, release = threading.Event(), threading.Event()
    write = exporter_module.write_policy

    def slow_write(graph, path, **kwargs):
        report = write(graph, path, **kwargs)
        written.set()  # the new file is complete under its temporary name
        assert release.wait(30)
        return report

    monkeypatch.setattr(exporter_module, "write_policy", slow_write)
    publisher = threading.Thread(target=exporter.end_batch, kwargs={"bp_step": 4})
    publisher.start()
    assert written.wait(60)
    assert published_step(latest) == 2  # the old file, whole
    hidden = [p.name for p in exports.iterdir() if p.name != LATEST_POLICY]
    assert len(hidden) == 1 and hidden[0].startswith(".") and hidden[0].endswith(".tmp")
    release.set()
    publisher.join(60)
    assert published_step(latest) == 4
    # The periodic versioned export (interval 4) goes on beside it, untouched by publishing.
    exporter.end_cycle(bp_step=4)
    assert sorted(p.name for p in exports.iterdir()) == [LATEST_POLICY, "policy_0.onnx"]


def test_a_failed_publication_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exports = tmp_path / "exports"
    _, exporter = make_exporter(exports, publish_interval=1)
    exporter.begin_training(bp_step=0)
    exporter.end_batch(bp_step=1)
    (exports / "notes.txt").write_text("the user's")  # beside the published file

    def broken(graph, path, **kwargs):
        Path(path).write_bytes(b"half a file")
        raise ExportError("onnx.checker rejected the export")

    monkeypatch.setattr(exporter_module, "write_policy", broken)
    with pytest.raises(ExportError):
        exporter.end_batch(bp_step=2)
    assert sorted(p.name for p in exports.iterdir()) == [LATEST_POLICY, "notes.txt"]
    assert (exports / "notes.txt").read_text() == "the user's"
    assert published_step(exports / LATEST_POLICY) == 1


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_a_bad_publish_interval_is_refused(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigurationError, match="publish_interval"):
        make_exporter(tmp_path, publish_interval=value)
