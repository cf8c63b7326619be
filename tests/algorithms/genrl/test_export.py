"""The acting module (latent policy and frozen decoder in one network) exports to ONNX and acts
the same in onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from emote_core.algorithms.genrl import (
    DecoderWrapper,
    LatentPolicyActing,
    PolicyWrapper,
    latent_policy_graph,
    make_vae,
)
from emote_core.errors import ConfigurationError, ExportError
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.onnx.graph import policy_metadata
from emote_core.onnx.writer import write_policy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace

LATENT_DIM, ACTION_DIM = 3, 2  # different widths: the noise input is the latent's


def policy_wrapper() -> PolicyWrapper:
    torch.manual_seed(0)
    vae = make_vae(observation_dim=5, action_dim=ACTION_DIM, latent_dim=LATENT_DIM,
                   hidden_dims=(16,))  # fmt: skip
    policy = GaussianMlpPolicy(observation_dim=5, action_dim=LATENT_DIM, hidden_dims=(16,))
    with torch.no_grad():  # a policy whose noise matters (emote's head starts nearly silent)
        for parameter in policy.head.parameters():
            parameter.normal_(0.0, 0.5)
    return PolicyWrapper(policy, DecoderWrapper(vae.decoder), latent_scale=3.0)


def spaces(**state: tuple[int, ...]) -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (ACTION_DIM,), low=-1.0, high=1.0),
        state=DictSpace({key: BoxSpace(np.float32, shape) for key, shape in state.items()}),
    )


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning")
def test_the_acting_module_traces_and_onnxruntime_acts_as_torch(tmp_path: Path) -> None:
    wrapper = policy_wrapper()
    acting = LatentPolicyActing(wrapper, ["obs"]).eval()
    path = tmp_path / "genrl.onnx"
    example = (torch.zeros(2, 5), torch.zeros(2, LATENT_DIM))
    torch.onnx.export(
        acting, example, str(path), dynamo=False, opset_version=15,
        input_names=["obs", "epsilon"], output_names=["actions"],
        dynamic_axes={name: {0: "batch"} for name in ("obs", "epsilon", "actions")},
    )  # fmt: skip
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((9, 5), dtype=np.float32)
    epsilon = rng.standard_normal((9, LATENT_DIM), dtype=np.float32)
    (actions,) = session.run(["actions"], {"obs": observations, "epsilon": epsilon})
    with torch.no_grad():
        expected = wrapper(torch.from_numpy(observations), torch.from_numpy(epsilon)).numpy()
    np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5)
    assert actions.shape == (9, ACTION_DIM) and np.abs(actions).max() <= 1.0
    (deterministic,) = session.run(["actions"], {"obs": observations, "epsilon": 0 * epsilon})
    assert np.abs(deterministic - actions).max() > 1e-3  # the noise input is wired to the policy


def test_the_policy_graph_passes_emotes_checked_writer(tmp_path: Path) -> None:
    graph = latent_policy_graph(policy_wrapper(), spaces(obs=(2,), velocity=(3,)))
    assert graph.input_names == ("obs", "velocity", "epsilon")
    assert graph.input_shapes["epsilon"] == (LATENT_DIM,)
    report = write_policy(graph, tmp_path / "genrl.onnx", opset=15,
                          metadata=policy_metadata(graph))  # fmt: skip
    assert report.max_abs_diff <= 1e-5
    assert report.metadata and report.outputs == ["actions"]


def test_an_observation_key_named_epsilon_is_refused() -> None:
    with pytest.raises(ExportError, match=r"observation key is named 'epsilon'"):
        latent_policy_graph(policy_wrapper(), spaces(epsilon=(5,)))
    with pytest.raises(ConfigurationError, match=r"exports a PolicyWrapper"):
        LatentPolicyActing(torch.nn.Linear(5, 2), ["obs"])  # type: ignore[arg-type]
