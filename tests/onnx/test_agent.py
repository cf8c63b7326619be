"""OnnxAgentProxy: acting from an exported file alone, as the torch proxies act."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from emote_core.algorithms.dqn import DoubleDQN
from emote_core.algorithms.sac import SoftActorCritic
from emote_core.errors import ConfigurationError, FormatError
from emote_core.nn import DiscreteActionValueMlp, GaussianMlpPolicy
from emote_core.onnx.agent import OnnxAgentProxy
from emote_core.onnx.format import MAX_POLICY_BYTES, OnnxPolicyVersion
from emote_core.onnx.graph import policy_metadata
from emote_core.onnx.writer import export_policy
from emote_core.proxies import EpsilonGreedyAgentProxy, MultiKeyAgentProxy
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.typing import DictObservation, EpisodeState

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
    state=DictSpace({"pos": BoxSpace(np.float32, (3,)), "grid": BoxSpace(np.float32, (2, 2))}),
)


@pytest.fixture(scope="module")
def sac_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[GaussianMlpPolicy, Path]:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=7, action_dim=2, hidden_dims=(16,))
    graph = SoftActorCritic().policy_graph(policy, SPACES)
    path = tmp_path_factory.mktemp("onnx") / "policy.onnx"
    export_policy(graph, path, metadata=policy_metadata(graph))
    return policy, path


def step(count: int, seed: int = 0, **states: EpisodeState) -> dict[int, DictObservation]:
    rng = np.random.default_rng(seed)
    result = {}
    for agent in range(count):
        state = states.get(f"a{agent}", EpisodeState.RUNNING)
        data = {"pos": rng.standard_normal(3).astype(np.float32),
                "grid": rng.standard_normal((2, 2)).astype(np.float32)}  # fmt: skip
        result[agent] = DictObservation(
            episode_state=state, array_data=data, rewards={"reward": 0.0}
        )
    return result


def actions_of(responses) -> np.ndarray:
    return np.stack([responses[a].list_data["actions"] for a in sorted(responses)])


def test_deterministic_actions_equal_the_torch_proxy(sac_export) -> None:
    policy, path = sac_export
    torch_proxy = MultiKeyAgentProxy(
        policy=policy, device="cpu", input_keys=["pos", "grid"], spaces=SPACES, deterministic=True
    )
    onnx_proxy = OnnxAgentProxy(path, spaces=SPACES)
    seen = step(6, a2=EpisodeState.TERMINAL, a4=EpisodeState.INTERRUPTED)
    from_onnx = onnx_proxy(seen)
    assert sorted(from_onnx) == [0, 1, 3, 5]  # final observations get no response
    np.testing.assert_allclose(actions_of(from_onnx), actions_of(torch_proxy(seen)), atol=1e-6)
    assert actions_of(from_onnx).dtype == np.float32
    assert onnx_proxy.input_names == ("pos", "grid") and onnx_proxy.output_names == ("actions",)


def test_stochastic_actions_are_seeded_samples(sac_export) -> None:
    _, path = sac_export
    seen = step(64)
    first = actions_of(OnnxAgentProxy(path, deterministic=False, seed=3)(seen))
    again = actions_of(OnnxAgentProxy(path, deterministic=False, seed=3)(seen))
    other = actions_of(OnnxAgentProxy(path, deterministic=False, seed=4)(seen))
    mean = actions_of(OnnxAgentProxy(path)(seen))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other) and not np.allclose(first, mean)
    assert np.all(np.abs(first) <= 1.0)


def test_dqn_exports_act_greedily_like_the_torch_proxy(tmp_path: Path) -> None:
    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)), actions=DiscreteSpace(n=4),
        state=DictSpace({"obs": BoxSpace(np.float32, (5,))}),
    )  # fmt: skip
    torch.manual_seed(1)
    q = DiscreteActionValueMlp(observation_dim=5, num_actions=4, hidden_dims=(16,))
    graph = DoubleDQN().policy_graph(q, spaces)
    export_policy(graph, tmp_path / "q.onnx", metadata=policy_metadata(graph))
    rng = np.random.default_rng(0)
    seen = {
        i: DictObservation(
            episode_state=EpisodeState.RUNNING,
            array_data={"obs": rng.standard_normal(5, np.float32)},
            rewards={},
        )
        for i in range(32)
    }
    greedy = EpsilonGreedyAgentProxy(q_network=q, device="cpu", num_actions=4, epsilon=0.0)
    from_onnx = actions_of(OnnxAgentProxy(tmp_path / "q.onnx", spaces=spaces)(seen))
    assert from_onnx.dtype == np.int64 and from_onnx.shape == (32, 1)
    np.testing.assert_array_equal(from_onnx, actions_of(greedy(seen)))


def test_observations_that_do_not_fit_are_refused_by_name(sac_export) -> None:
    _, path = sac_export
    proxy = OnnxAgentProxy(path)
    missing = {
        0: DictObservation(
            episode_state=EpisodeState.RUNNING, array_data={"pos": np.zeros(3)}, rewards={}
        )
    }
    with pytest.raises(ConfigurationError, match="has no 'grid'"):
        proxy(missing)
    wrong = {
        0: DictObservation(
            episode_state=EpisodeState.RUNNING,
            array_data={"pos": np.zeros(4), "grid": np.zeros((2, 2))},
            rewards={},
        )
    }
    with pytest.raises(ConfigurationError, match=r"observation 'pos' of agent 0 has shape \(4,\)"):
        proxy(wrong)
    other_env = MDPSpace(
        rewards=SPACES.rewards, actions=SPACES.actions,
        state=DictSpace({"obs": BoxSpace(np.float32, (7,))}),
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="run it on the environment it was trained on"):
        OnnxAgentProxy(path, spaces=other_env)
    wider = MDPSpace(
        rewards=SPACES.rewards, actions=SPACES.actions,
        state=DictSpace({"pos": BoxSpace(np.float32, (4,)), "grid": SPACES.state["grid"]}),
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        OnnxAgentProxy(path, spaces=wider)
    assert "reads observations 'pos' of 3 numbers; the environment gives 4 numbers" in str(
        refused.value
    )


def test_files_that_are_not_emote_exports_are_refused(tmp_path: Path, sac_export) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        OnnxAgentProxy(tmp_path / "missing.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    with pytest.raises(FormatError, match="onnxruntime cannot load"):
        OnnxAgentProxy(tmp_path / "garbage.onnx")

    model = onnx.load(str(sac_export[1]))
    del model.metadata_props[:]
    onnx.save(model, str(tmp_path / "plain.onnx"))
    with pytest.raises(FormatError, match="is not an emote policy export"):
        OnnxAgentProxy(tmp_path / "plain.onnx")

    model = onnx.load(str(sac_export[1]))
    for prop in model.metadata_props:
        if prop.key == "format_version":
            prop.value = "99"
    onnx.save(model, str(tmp_path / "future.onnx"))
    latest = int(OnnxPolicyVersion.LATEST)
    with pytest.raises(FormatError, match=f"format_version 99; this emote reads up to {latest}"):
        OnnxAgentProxy(tmp_path / "future.onnx")


def test_a_pipe_a_device_or_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.onnx"
    os.mkfifo(pipe)  # no writer: opening it for reading the usual way would wait for ever
    with pytest.raises(FormatError, match=r"'.*pipe\.onnx' is not a file \(mode p"):
        OnnxAgentProxy(pipe)
    zero = tmp_path / "zero.onnx"
    zero.symlink_to("/dev/zero")  # endless: reading it whole would never end
    with pytest.raises(FormatError, match=r"'.*zero\.onnx' is not a file \(mode c"):
        OnnxAgentProxy(zero)
    huge = tmp_path / "huge.onnx"
    with huge.open("wb") as file:
        file.truncate(MAX_POLICY_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(FormatError, match=f"holds {MAX_POLICY_BYTES + 1} bytes, more than"):
        OnnxAgentProxy(huge)


def test_act_batch_acts_as_the_per_agent_call_for_torch_and_onnx(sac_export) -> None:
    policy, path = sac_export
    seen = step(9)
    batch = {
        key: np.stack([seen[a].array_data[key] for a in sorted(seen)]) for key in ("pos", "grid")
    }

    def torch_proxy() -> MultiKeyAgentProxy:
        return MultiKeyAgentProxy(policy=policy, device="cpu", input_keys=["pos", "grid"],
                                  spaces=SPACES, seed=5)  # fmt: skip

    for make in (torch_proxy, lambda: OnnxAgentProxy(path, deterministic=False, seed=5)):
        per_agent, batched = make(), make()
        for _ in range(2):  # the noise streams stay in step call after call
            expected = actions_of(per_agent(seen))
            got = batched.act_batch(batch)
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)
        with pytest.raises(ConfigurationError, match="'grid'"):
            batched.act_batch({"pos": batch["pos"]})
        with pytest.raises(ConfigurationError, match="rows of shape"):
            batched.act_batch({"pos": batch["pos"][:, :2], "grid": batch["grid"]})
