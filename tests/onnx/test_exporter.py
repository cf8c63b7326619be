"""ONNX export: opsets, one file, metadata, parity with torch, atomic writes, the OnnxExporter."""

from __future__ import annotations

import functools
import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from emote_core.algorithms.dqn import DoubleDQN
from emote_core.algorithms.sac import SoftActorCritic
from emote_core.callback import Callback, Order
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError, ExportError
from emote_core.memory.callbacks import MemoryWarmup
from emote_core.nn import DiscreteActionValueMlp, GaussianMlpPolicy
from emote_core.onnx.exporter import OnnxExporter
from emote_core.onnx.format import PolicyMetadata, user_metadata_props
from emote_core.onnx.graph import PolicyGraph, policy_metadata
from emote_core.onnx.writer import export_policy
from emote_core.proxies import EpsilonGreedyAgentProxy, MultiKeyAgentProxy
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.trainer import Trainer, TrainingShutdownException
from emote_core.typing import DictObservation, EpisodeState

SAC_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
    state=DictSpace({"pos": BoxSpace(np.float32, (3,)), "grid": BoxSpace(np.float32, (2, 2))}),
)
DQN_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=DiscreteSpace(n=3),
    state=DictSpace({"obs": BoxSpace(np.float32, (4,))}),
)


def sac_policy() -> GaussianMlpPolicy:
    torch.manual_seed(0)
    return GaussianMlpPolicy(observation_dim=7, action_dim=2, hidden_dims=(16, 16))


def export_sac(path: Path, opset: int = 15, **kwargs) -> tuple[GaussianMlpPolicy, object]:
    policy = sac_policy()
    graph = SoftActorCritic().policy_graph(policy, SAC_SPACES)
    report = export_policy(graph, path, opset=opset, metadata=policy_metadata(graph), **kwargs)
    return policy, report


def observations(rng: np.random.Generator, count: int) -> dict[int, DictObservation]:
    rows = [
        {"pos": rng.standard_normal(3, dtype=np.float32),
         "grid": rng.standard_normal((2, 2), dtype=np.float32)}
        for _ in range(count)
    ]  # fmt: skip
    running = EpisodeState.RUNNING
    return {
        i: DictObservation(episode_state=running, array_data=row, rewards={"reward": 0.0})
        for i, row in enumerate(rows)
    }


@pytest.mark.parametrize("opset", [9, 13, 15, 17, 18, 23])
def test_each_supported_opset_is_written_as_asked_in_one_file(tmp_path: Path, opset: int) -> None:
    _, report = export_sac(tmp_path / "policy.onnx", opset=opset)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.onnx"]  # no sidecar, no temp
    model = onnx.load(str(tmp_path / "policy.onnx"), load_external_data=False)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    onnx.checker.check_model(model, full_check=True)
    assert report.opset == opset
    assert report.max_abs_diff < 1e-5
    assert sorted(report.parity) == [1, 7, 256]
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        ("pos", ["batch", 3]), ("grid", ["batch", 2, 2]), ("epsilon", ["batch", 2])
    ]  # fmt: skip
    assert [(o.name, o.shape) for o in session.get_outputs()] == [("actions", ["batch", 2])]


def test_force_refuses_a_named_pipe_unread_and_keeps_it(tmp_path: Path) -> None:
    pipe = tmp_path / "policy.onnx"
    os.mkfifo(pipe)  # opened for reading the usual way, it would wait for a writer for ever
    with pytest.raises(
        ExportError, match=r"'.*policy\.onnx' is not a file \(mode p.*`force=True` replaces only"
    ):
        export_sac(pipe, force=True)
    assert stat.S_ISFIFO(pipe.lstat().st_mode)  # not replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.onnx"]


def test_the_file_acts_exactly_as_the_torch_proxy(tmp_path: Path) -> None:
    policy, _ = export_sac(tmp_path / "policy.onnx")
    proxy = MultiKeyAgentProxy(
        policy=policy, device="cpu", input_keys=["pos", "grid"], spaces=SAC_SPACES,
        deterministic=True,
    )  # fmt: skip
    seen = observations(np.random.default_rng(1), 5)
    expected = np.stack([r.list_data["actions"] for r in proxy(seen).values()])
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    feed = {
        "pos": np.stack([o.array_data["pos"] for o in seen.values()]),
        "grid": np.stack([o.array_data["grid"] for o in seen.values()]),
        "epsilon": np.zeros((5, 2), np.float32),
    }
    (actions,) = session.run(["actions"], feed)
    np.testing.assert_allclose(actions, expected, atol=1e-6)
    assert np.all(np.abs(actions) <= 1.0)


def test_metadata_describes_the_policy_without_the_training_code(tmp_path: Path) -> None:
    export_sac(tmp_path / "policy.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"))
    props = session.get_modelmeta().custom_metadata_map
    assert props["algorithm"] == "sac"
    assert props["opset"] == "15"
    assert json.loads(props["input_names"]) == ["pos", "grid", "epsilon"]
    assert json.loads(props["output_names"]) == ["actions"]
    assert json.loads(props["observation_space"])["spaces"]["grid"]["shape"] == [2, 2]
    assert json.loads(props["action_bounds"])["low"] == [-1.0, -1.0]
    metadata = PolicyMetadata.from_props(props, source="policy.onnx")
    assert metadata.observation_keys == ("pos", "grid") and metadata.stochastic


def test_dqn_exports_greedy_actions_and_q_values(tmp_path: Path) -> None:
    torch.manual_seed(0)
    q = DiscreteActionValueMlp(observation_dim=4, num_actions=3, hidden_dims=(8,))
    graph = DoubleDQN().policy_graph(q, DQN_SPACES)
    report = export_policy(graph, tmp_path / "q.onnx", metadata=policy_metadata(graph))
    assert report.inputs == ["obs"] and report.outputs == ["actions", "q_values"]
    session = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"))
    obs = np.random.default_rng(0).standard_normal((9, 4), dtype=np.float32)
    actions, values = session.run(None, {"obs": obs})
    assert actions.dtype == np.int64 and actions.shape == (9, 1)
    greedy = EpsilonGreedyAgentProxy(q_network=q, device="cpu", num_actions=3, epsilon=0.0)
    seen = {
        i: DictObservation(episode_state=EpisodeState.RUNNING, array_data={"obs": row}, rewards={})
        for i, row in enumerate(obs)
    }
    expected = np.stack([r.list_data["actions"] for r in greedy(seen).values()])
    np.testing.assert_array_equal(actions, expected)
    np.testing.assert_allclose(values, q(torch.from_numpy(obs)).detach().numpy(), atol=1e-5)


@pytest.mark.parametrize("opset", [8, 24, 0])
def test_unsupported_opsets_are_refused_naming_the_range(tmp_path: Path, opset: int) -> None:
    with pytest.raises(ConfigurationError, match="opsets 9 to 23"):
        export_sac(tmp_path / "policy.onnx", opset=opset)
    assert not list(tmp_path.iterdir())


def test_a_parity_failure_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = PolicyGraph.run

    def drifting(self, inputs):
        return {name: out + 0.01 for name, out in original(self, inputs).items()}

    monkeypatch.setattr(PolicyGraph, "run", drifting)
    with pytest.raises(ExportError, match="differs from the torch policy at batch 1"):
        export_sac(tmp_path / "policy.onnx")
    assert not list(tmp_path.iterdir())


def test_existing_and_unwritable_destinations(tmp_path: Path) -> None:
    (tmp_path / "policy.onnx").write_bytes(b"keep me")
    with pytest.raises(ExportError, match="already exists; pass `force=True` to replace it"):
        export_sac(tmp_path / "policy.onnx")
    assert (tmp_path / "policy.onnx").read_bytes() == b"keep me"
    refusal = "is not an ONNX model; `force=True` replaces only an ONNX file — choose another `out`"
    with pytest.raises(ExportError, match=refusal):
        export_sac(tmp_path / "policy.onnx", force=True)
    assert (tmp_path / "policy.onnx").read_bytes() == b"keep me"
    (tmp_path / "policy.onnx").unlink()
    export_sac(tmp_path / "policy.onnx")
    export_sac(tmp_path / "policy.onnx", force=True)  # an ONNX model is replaced
    assert onnx.load(str(tmp_path / "policy.onnx")).graph.output[0].name == "actions"

    with pytest.raises(ExportError, match="is not an existing directory"):
        export_sac(tmp_path / "missing" / "policy.onnx")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ExportError, match="is not an existing directory"):
        export_sac(tmp_path / "a_file" / "policy.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "policy.onnx"]
    if Path("/proc/self").is_dir():  # a directory that looks writable to root but makes no files
        with pytest.raises(ExportError, match=r"^cannot write '/proc/policy.onnx': "):
            export_sac(Path("/proc/policy.onnx"))


def test_an_observation_key_named_epsilon_is_refused() -> None:
    spaces = MDPSpace(
        rewards=SAC_SPACES.rewards, actions=SAC_SPACES.actions,
        state=DictSpace({"epsilon": BoxSpace(np.float32, (7,))}),
    )  # fmt: skip
    with pytest.raises(ExportError, match="reserve for the noise input"):
        SoftActorCritic().policy_graph(sac_policy(), spaces)


class Updates(Callback):
    """Moves the policy's weights a little every batch, as a loss would."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__(name="updates")
        self.policy = policy

    def backward(self) -> None:
        with torch.no_grad():
            for parameter in self.policy.parameters():
                parameter.add_(1e-4)


class UntilExported(Callback):
    """Ends training once the exporter holds an export: a request made meanwhile is served."""

    order = Order.TERMINATOR

    def __init__(self, exporter: OnnxExporter) -> None:
        super().__init__(name="until_exported")
        self.exporter = exporter

    def end_batch(self, bp_step: int) -> None:
        if self.exporter.items():
            raise TrainingShutdownException("exported")


def batches(count: int | None = None):
    step = 0
    while count is None or step < count:
        step += 1
        yield {"batch_size": 1}


def make_exporter(tmp_path: Path, **kwargs) -> tuple[GaussianMlpPolicy, OnnxExporter]:
    policy = sac_policy()
    exporter = OnnxExporter(
        graph=functools.partial(SoftActorCritic().policy_graph, policy, SAC_SPACES),
        directory=tmp_path / "exports", **kwargs,
    )  # fmt: skip
    return policy, exporter


def test_periodic_exports_record_their_update_and_are_managed_as_items(tmp_path: Path) -> None:
    _, exporter = make_exporter(tmp_path, interval=4, max_exports=2)
    exporter.add_metadata("game_build", {"branch": "main"})
    Trainer([exporter, BackPropStepsTerminator(bp_steps=12)], batches()).train()
    items = exporter.items()
    assert [p.name for p in sorted((tmp_path / "exports").iterdir())] == [
        "policy_1.onnx", "policy_2.onnx"
    ]  # fmt: skip
    assert exporter.latest() == items[-1]
    steps = []
    for item in items:
        props = onnxruntime.InferenceSession(item.filepath).get_modelmeta().custom_metadata_map
        steps.append(int(props["training_step"]))
        assert json.loads(props["game_build"]) == {"branch": "main"}
    assert steps == [8, 12]
    assert exporter.delete(items[0].handle) and exporter.get(items[0].handle) is None
    with pytest.raises(ConfigurationError, match="written by emote itself"):
        exporter.add_metadata("training_step", "7")


def test_requests_from_other_threads_are_served_by_the_training_thread(
    tmp_path: Path, no_hang: None
) -> None:
    policy, exporter = make_exporter(tmp_path)
    served: list[tuple[str, int]] = []

    def client() -> None:
        item = exporter.export_threadsafe({"requested_by": "client"}, timeout=60)
        props = onnxruntime.InferenceSession(item.filepath).get_modelmeta().custom_metadata_map
        served.append((props["requested_by"], int(props["training_step"])))

    thread = threading.Thread(target=client)
    thread.start()
    # Training runs until the exporter served the request: only the training thread exports.
    callbacks = [Updates(policy), exporter, UntilExported(exporter)]
    state = Trainer(callbacks, batches()).train()
    thread.join(timeout=60)
    assert len(served) == 1 and served[0][0] == "client"
    assert 0 <= served[0][1] <= state["bp_step"]
    # After training, requests run on the caller's thread at once.
    assert exporter.export_threadsafe(timeout=5).handle.value == 1


def test_requests_are_served_while_warm_up_waits(tmp_path: Path) -> None:
    _, exporter = make_exporter(tmp_path)
    done = threading.Event()

    class Loader:
        def is_ready(self) -> bool:
            return done.is_set()

    errors: list[ExportError] = []

    def client() -> None:
        try:
            exporter.export_threadsafe(timeout=30)
        except ExportError as error:
            errors.append(error)
        finally:
            done.set()  # the memory fills only once the collector has its policy

    warmup = MemoryWarmup(loader=Loader(), exporter=exporter, poll_interval=0.01)
    thread = threading.Thread(target=client)
    thread.start()
    Trainer([warmup, exporter, BackPropStepsTerminator(bp_steps=1)], batches()).train()
    thread.join(timeout=60)
    assert errors == [] and len(exporter.items()) == 1


def test_an_unserved_request_times_out_with_a_clear_error(tmp_path: Path) -> None:
    _, exporter = make_exporter(tmp_path)
    with pytest.raises(ExportError, match=r"did not serve the export request within 0\.05 s"):
        exporter.export_threadsafe(timeout=0.05)
    exporter.process_pending_exports()  # the cancelled request is dropped, not exported
    assert exporter.items() == []


def test_metadata_keys_must_be_strings_and_user_entries_are_listed_alone(tmp_path: Path) -> None:
    _, exporter = make_exporter(tmp_path)
    with pytest.raises(TypeError, match="must be strings; got 1"):
        exporter.add_metadata(1, "value")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be strings"):
        exporter.export({2: "value"})  # refused before anything is written
    with pytest.raises(ConfigurationError, match="written by emote itself"):
        exporter.export({"format": "mine"})
    assert not list((tmp_path / "exports").glob("*.onnx"))
    exporter.add_metadata("first", "a")
    exporter.add_metadata("second", "overridden")
    model = onnx.load(exporter.export({"third": 3, "second": "b"}).filepath)
    user = [(p.key, p.value) for p in user_metadata_props(model)]
    assert user == [("first", "a"), ("second", "b"), ("third", "3")]
    assert len(model.metadata_props) > len(user)  # emote's own entries follow
