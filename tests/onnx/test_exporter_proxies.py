"""OnnxExporter built as upstream emote builds it: from any agent proxy, its spaces and
requires_epsilon, with exports queued from other threads and waited on."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError, ExportError
from emote_core.nn import GaussianMlpPolicy
from emote_core.onnx.exporter import OnnxExporter, QueuedExport
from emote_core.proxies import FeatureAgentProxy, GenericAgentProxy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (3,)), "goal": BoxSpace(np.float32, (1,))}),
)


def feature_proxy() -> FeatureAgentProxy:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(16,))
    return FeatureAgentProxy(policy=policy, device="cpu", input_key="obs", spaces=SPACES)


class Nudge(Callback):
    """Changes the weights a little every batch, as training would."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def backward(self) -> None:
        with torch.no_grad():
            for parameter in self.policy.parameters():
                parameter.add_(1e-3)


def batches():
    while True:
        yield {"batch_size": 1}


def test_upstreams_positional_call_exports_the_proxys_policy_on_its_interval(tmp_path) -> None:
    proxy = feature_proxy()
    exporter = OnnxExporter(proxy, SPACES, True, tmp_path, 3)  # upstream's argument order
    Trainer([Nudge(proxy.policy), exporter, BackPropStepsTerminator(bp_steps=6)], batches()).train()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["savedmodel_0.onnx", "savedmodel_1.onnx"]
    session = onnxruntime.InferenceSession(exporter.latest().filepath)
    assert [i.name for i in session.get_inputs()] == ["obs", "epsilon"]
    assert [o.name for o in session.get_outputs()] == ["actions"]
    rows = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    noise = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    (actions,) = session.run(None, {"obs": rows, "epsilon": noise})
    expected = proxy.policy.act(torch.from_numpy(rows), torch.from_numpy(noise))
    np.testing.assert_allclose(actions, expected.detach().numpy(), atol=1e-5)


def test_a_proxy_without_noise_exports_its_inputs_in_the_proxys_order(tmp_path) -> None:
    class GoalThenObs(nn.Module):
        def forward(self, goal, obs):
            return torch.tanh(obs[:, :2] * goal)

    proxy = GenericAgentProxy(
        policy=GoalThenObs(), device="cpu", input_keys=["goal", "obs"], output_keys=["actions"]
    )
    exporter = OnnxExporter(
        agent_proxy=proxy, spaces=SPACES, requires_epsilon=False, directory=tmp_path,
        prefix="policy_", device="cpu",
    )  # fmt: skip
    item = exporter.export()
    assert Path(item.filepath).name.startswith("policy_")
    session = onnxruntime.InferenceSession(item.filepath)
    assert [i.name for i in session.get_inputs()] == ["goal", "obs"]
    goal, obs = np.full((2, 1), 0.5, np.float32), np.ones((2, 3), np.float32)
    np.testing.assert_allclose(session.run(None, {"goal": goal, "obs": obs})[0], np.tanh(0.5))


def test_a_queued_export_is_served_by_the_training_thread_and_can_be_waited_on(tmp_path) -> None:
    proxy = feature_proxy()
    exporter = OnnxExporter(proxy, SPACES, True, tmp_path)
    requested = threading.Event()
    results: list = []

    def from_another_thread() -> None:
        queued = exporter.queue_export({"who": "evaluator"})
        requested.set()
        results.append((queued, queued.block_until_complete(timeout=60)))

    thread = threading.Thread(target=from_another_thread)

    class Requester(Callback):
        def begin_training(self) -> None:
            thread.start()
            requested.wait(60)

    Trainer([Requester(), exporter, BackPropStepsTerminator(bp_steps=3)], batches()).train()
    thread.join(60)
    queued, item = results[0]
    assert isinstance(queued, QueuedExport) and queued.done() and queued.return_value == item
    props = onnxruntime.InferenceSession(item.filepath).get_modelmeta().custom_metadata_map
    assert props["who"] == "evaluator"


def test_proxies_that_cannot_be_exported_fail_when_the_exporter_is_built(tmp_path) -> None:
    proxy = feature_proxy()
    with pytest.raises(ConfigurationError, match="exactly one of them"):
        OnnxExporter(directory=tmp_path)
    with pytest.raises(ConfigurationError, match=r"needs spaces=.*requires_epsilon"):
        OnnxExporter(proxy, directory=tmp_path)
    with pytest.raises(ExportError, match="needs a 'policy'"):
        OnnxExporter(object(), SPACES, False, tmp_path)

    class Elsewhere:
        policy = proxy.policy
        input_names = ("lidar",)

    with pytest.raises(ExportError, match=r"inputs \['lidar'\] are not in the observation space"):
        OnnxExporter(Elsewhere(), SPACES, True, tmp_path)

    class TrainModeOutputs(nn.Module):
        def forward(self, obs):
            return obs[:, :2], obs[:, :1]

    two = GenericAgentProxy(
        policy=TrainModeOutputs(), device="cpu", input_keys=["obs"], output_keys=["actions"]
    )
    with pytest.raises(ExportError, match="returned 2 outputs in eval mode"):
        OnnxExporter(two, SPACES, False, tmp_path)
