"""The ml-agents export profile: a file checked the way Unity's ML-Agents runtime checks a model
when it loads one, and onnxruntime parity with the torch acting networks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from emote_core.algorithms.dqn import DoubleDQN
from emote_core.algorithms.sac import SoftActorCritic
from emote_core.errors import ConfigurationError, ExportError, FormatError
from emote_core.nn import DiscreteActionValueMlp, GaussianMlpPolicy
from emote_core.onnx.agent import OnnxAgentProxy
from emote_core.onnx.format import ExportProfile, OnnxPolicyVersion, PolicyMetadata
from emote_core.onnx.graph import policy_graph, policy_metadata
from emote_core.onnx.ml_agents import check_ml_agents_opset, ml_agents_graph, ml_agents_metadata
from emote_core.onnx.writer import ExportReport, export_policy
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.typing import DictObservation, EpisodeState

SAC_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
    state=DictSpace({"pos": BoxSpace(np.float32, (3,)), "grid": BoxSpace(np.float32, (2, 4))}),
)
PIXEL_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (1,), low=-1.0, high=1.0),
    state=DictSpace(
        {"camera": BoxSpace(np.uint8, (6, 5, 3), low=0, high=255),
         "speed": BoxSpace(np.float32, (2,))}
    ),
)  # fmt: skip
DQN_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=DiscreteSpace(n=4),
    state=DictSpace({"obs": BoxSpace(np.float32, (5,))}),
)
SENTIS_OPSETS = range(7, 16)
"""What Unity's inference engine (Sentis) imports."""
KNOWN_INPUTS = {"action_masks", "epsilon", "prev_action", "sequence_length", "recurrent_in"}
"""The inputs besides obs_i that ML-Agents' loader accepts (SentisModelParamLoader's
CheckInputTensorShape)."""


@dataclass
class Behaviour:
    """What a Unity agent declares: its sensors' observation shapes (images CHW, as
    ``ObservationSpec.Shape``), its continuous action count and its discrete branch sizes."""

    sensors: list[tuple[int, ...]]
    continuous: int = 0
    branches: list[int] = field(default_factory=list)


def unity_load_checks(path: Path, behaviour: Behaviour, *, deterministic: bool) -> list[str]:
    """The checks ML-Agents' ``SentisModelParamLoader.CheckModel`` and ``SentisModelInfo`` make
    when a model is assigned to an agent, as failure messages (empty when the model loads).

    Like SentisModelInfo, the model is first run once with every input zero-filled at batch 1
    (so its constants can be read), then batch 7 proves the batch axis is dynamic.
    """
    model = onnx.load(str(path))
    failed: list[str] = []
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(opsets) != 1 or opsets[0] not in SENTIS_OPSETS:
        failed.append(f"opset {opsets} is not one Sentis imports (7-15)")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    for value in inputs.values():
        if value.type != "tensor(float)":  # Unity fills every input as floats
            failed.append(f"input {value.name} is {value.type}, not float")
        if not isinstance(value.shape[0], str):
            failed.append(f"input {value.name} has a fixed batch axis {value.shape}")

    def run(batch: int) -> dict[str, np.ndarray]:
        feed = {
            name: np.zeros((batch, *value.shape[1:]), dtype=np.float32)
            for name, value in inputs.items()
        }
        return dict(zip(outputs, session.run(list(outputs), feed), strict=True))

    constants = run(1)
    for required in ("version_number", "memory_size"):
        if required not in constants:
            return [*failed, f'Required constant "{required}" was not found in the model file.']
    version = int(constants["version_number"].astype(np.float32).reshape(-1)[0])
    if not 2 <= version <= 3:
        failed.append(f"model version {version} is outside 2-3")
    if int(constants["memory_size"].reshape(-1)[0]) != 0:
        failed.append("memory_size is not 0 (no recurrent_in / recurrent_out here)")
    for name in ("version_number", "memory_size", "continuous_action_output_shape",
                 "discrete_action_output_shape"):  # fmt: skip
        if name in outputs and outputs[name].type != "tensor(float)":
            failed.append(f"{name} is {outputs[name].type}; Unity reads it as Tensor<float>")
    prefix = "deterministic_" if deterministic else ""
    actions = [f"{prefix}continuous_actions", f"{prefix}discrete_actions"]
    if not any(name in outputs for name in actions):
        return [*failed, "The model does not contain any Action Output Node."]
    continuous = 0
    if "continuous_actions" in outputs:
        if "continuous_action_output_shape" not in constants:
            failed.append("continuous actions but no Continuous Action Output Shape Node")
        else:
            continuous = int(constants["continuous_action_output_shape"].reshape(-1)[0])
        if f"{prefix}continuous_actions" not in outputs:
            failed.append(f"no {prefix}continuous_actions output")
    if continuous != behaviour.continuous:
        failed.append(f"Continuous Action Size: expected {behaviour.continuous}, got {continuous}")
    branches: list[int] = []
    if "discrete_actions" in outputs:
        shape = constants.get("discrete_action_output_shape")
        branches = [] if shape is None else [int(b) for b in shape.reshape(-1)]
        if f"{prefix}discrete_actions" not in outputs:
            failed.append(f"no {prefix}discrete_actions output")
        if "action_masks" not in inputs:
            failed.append("The model does not contain an Action Mask but is using Discrete Control")
        elif inputs["action_masks"].shape[1:] != [sum(behaviour.branches)]:
            failed.append(f"action_masks has shape {inputs['action_masks'].shape}")
    if branches != behaviour.branches:
        failed.append(f"Discrete Action branches: expected {behaviour.branches}, got {branches}")
    for index, sensor in enumerate(behaviour.sensors):
        name = f"obs_{index}"
        if name not in inputs:
            failed.append(f"no Observation Placeholder Input for sensor {index}")
        elif tuple(inputs[name].shape[1:]) != sensor:
            failed.append(f"{name} has shape {inputs[name].shape}; the sensor gives {sensor}")
    observed = {f"obs_{index}" for index in range(len(behaviour.sensors))}
    for name in inputs:
        if name not in observed and name not in KNOWN_INPUTS:
            failed.append(f"Model contains an unexpected input named : {name}")
    rows = run(7)
    for name in actions:
        if name in rows and rows[name].shape[0] != 7:
            failed.append(f"{name} has {rows[name].shape[0]} rows at batch 7")
        if name in outputs and not isinstance(outputs[name].shape[0], str):
            failed.append(f"{name} has a fixed batch axis {outputs[name].shape}")
    return failed


def export(graph, path: Path, *, opset: int = 15) -> ExportReport:
    graph = ml_agents_graph(graph)
    metadata = ml_agents_metadata(policy_metadata(graph, recipe_name="test"), graph)
    return export_policy(graph, path, opset=opset, metadata=metadata)


def sac_policy(observation_dim: int, action_dim: int) -> GaussianMlpPolicy:
    torch.manual_seed(0)
    return GaussianMlpPolicy(
        observation_dim=observation_dim, action_dim=action_dim, hidden_dims=(16, 16)
    )


def dqn_network() -> DiscreteActionValueMlp:
    torch.manual_seed(0)
    return DiscreteActionValueMlp(observation_dim=5, num_actions=4, hidden_dims=(16,))


def rows(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(value, dtype=np.float32)).reshape(len(value), -1)


@pytest.mark.parametrize("opset", [9, 15])
def test_a_sac_export_loads_the_way_unity_checks_it_and_acts_as_torch(
    tmp_path: Path, opset: int
) -> None:
    policy = sac_policy(11, 2)
    path = tmp_path / "policy.onnx"
    report = export(SoftActorCritic().policy_graph(policy, SAC_SPACES), path, opset=opset)
    assert report.inputs == ["obs_0", "obs_1", "epsilon"]
    assert report.outputs == [
        "version_number", "memory_size", "continuous_actions", "continuous_action_output_shape",
        "deterministic_continuous_actions",
    ]  # fmt: skip
    behaviour = Behaviour(sensors=[(3,), (2, 4)], continuous=2)
    for deterministic in (True, False):
        assert unity_load_checks(path, behaviour, deterministic=deterministic) == []

    rng = np.random.default_rng(3)
    pos = rng.standard_normal((7, 3), dtype=np.float32)
    grid = rng.standard_normal((7, 2, 4), dtype=np.float32)
    noise = rng.standard_normal((7, 2), dtype=np.float32)
    session = onnxruntime.InferenceSession(str(path))
    sampled, deterministic = session.run(
        ["continuous_actions", "deterministic_continuous_actions"],
        {"obs_0": pos, "obs_1": grid, "epsilon": noise},
    )
    features = torch.cat([rows(pos), rows(grid)], dim=1)
    with torch.no_grad():
        expected_deterministic = policy.eval()(features, torch.zeros(7, 2)).numpy()
        expected_sampled = policy(features, torch.from_numpy(noise)).numpy()
    np.testing.assert_allclose(deterministic, expected_deterministic, atol=1e-5, rtol=0)
    np.testing.assert_allclose(sampled, expected_sampled, atol=1e-5, rtol=0)
    assert not np.allclose(sampled, deterministic)  # the noise is used


def test_images_are_channels_first_in_unitys_pixel_scale(tmp_path: Path) -> None:
    policy = sac_policy(6 * 5 * 3 + 2, 1)
    path = tmp_path / "pixels.onnx"
    export(SoftActorCritic().policy_graph(policy, PIXEL_SPACES), path)
    behaviour = Behaviour(sensors=[(3, 6, 5), (2,)], continuous=1)  # CameraSensor: (C, H, W)
    assert unity_load_checks(path, behaviour, deterministic=True) == []

    rng = np.random.default_rng(4)
    camera = rng.integers(0, 256, size=(7, 6, 5, 3), dtype=np.uint8)
    speed = rng.standard_normal((7, 2), dtype=np.float32)
    session = onnxruntime.InferenceSession(str(path))
    unity_pixels = camera.transpose(0, 3, 1, 2).astype(np.float32) / 255.0  # how Unity sends them
    (actions,) = session.run(
        ["deterministic_continuous_actions"],
        {"obs_0": unity_pixels, "obs_1": speed, "epsilon": np.zeros((7, 1), np.float32)},
    )
    with torch.no_grad():  # emote's networks read the uint8 values as floats, unscaled
        expected = policy.eval()(torch.cat([rows(camera), rows(speed)], 1), torch.zeros(7, 1))
    np.testing.assert_allclose(actions, expected.numpy(), atol=1e-5, rtol=0)


def test_a_dqn_export_loads_and_takes_the_best_allowed_action(tmp_path: Path) -> None:
    q = dqn_network()
    path = tmp_path / "q.onnx"
    report = export(DoubleDQN().policy_graph(q, DQN_SPACES), path, opset=9)
    assert report.inputs == ["obs_0", "action_masks"]
    assert report.outputs == [
        "version_number", "memory_size", "discrete_actions", "discrete_action_output_shape",
        "deterministic_discrete_actions",
    ]  # fmt: skip
    behaviour = Behaviour(sensors=[(5,)], branches=[4])
    for deterministic in (True, False):
        assert unity_load_checks(path, behaviour, deterministic=deterministic) == []

    rng = np.random.default_rng(5)
    obs = rng.standard_normal((64, 5), dtype=np.float32)
    with torch.no_grad():
        values = q.eval()(torch.from_numpy(obs)).numpy()
    session = onnxruntime.InferenceSession(str(path))
    ones = np.ones((64, 4), dtype=np.float32)
    sampled, greedy = session.run(
        ["discrete_actions", "deterministic_discrete_actions"], {"obs_0": obs, "action_masks": ones}
    )
    assert greedy.dtype == np.int64 and greedy.shape == (64, 1)
    np.testing.assert_array_equal(greedy[:, 0], values.argmax(axis=1))
    np.testing.assert_array_equal(sampled, greedy)

    best = values.argmax(axis=1)
    masks = rng.integers(0, 2, size=(64, 4)).astype(np.float32)
    masks[np.arange(64), best] = 0.0  # the unmasked best is never allowed
    masks[np.arange(64), (best + 1) % 4] = 1.0  # one action always is
    (masked,) = session.run(
        ["deterministic_discrete_actions"], {"obs_0": obs, "action_masks": masks}
    )
    expected = np.where(masks > 0.5, values, -np.inf).argmax(axis=1)
    np.testing.assert_array_equal(masked[:, 0], expected)
    assert np.all(masks[np.arange(64), masked[:, 0]] == 1.0)


def test_the_metadata_is_emotes_with_the_profile_and_the_observation_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.onnx"
    export(SoftActorCritic().policy_graph(sac_policy(11, 2), SAC_SPACES), path)
    props = onnxruntime.InferenceSession(str(path)).get_modelmeta().custom_metadata_map
    assert props["format"] == "emote-policy" and props["profile"] == "ml-agents"
    assert props["format_version"] == str(int(OnnxPolicyVersion.V3))
    assert json.loads(props["observation_keys"]) == ["pos", "grid"]
    assert json.loads(props["input_names"]) == ["obs_0", "obs_1", "epsilon"]
    assert props["algorithm"] == "sac" and props["recipe"] == "test" and props["opset"] == "15"
    metadata = PolicyMetadata.from_props(props, source="policy.onnx")
    assert metadata.profile is ExportProfile.ML_AGENTS
    assert metadata.observation_keys == ("pos", "grid") and metadata.stochastic

    emote_graph = SoftActorCritic().policy_graph(sac_policy(11, 2), SAC_SPACES)
    emote_props = policy_metadata(emote_graph).to_props()  # emote's own profile: as before
    assert emote_props["format_version"] == "1" and "profile" not in emote_props


def test_a_file_that_names_keys_its_space_lacks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.onnx"
    export(SoftActorCritic().policy_graph(sac_policy(11, 2), SAC_SPACES), path)
    props = dict(onnxruntime.InferenceSession(str(path)).get_modelmeta().custom_metadata_map)
    props["observation_keys"] = json.dumps(["pos", "lidar"])
    with pytest.raises(FormatError, match=r"names observation keys \['pos', 'lidar'\]"):
        PolicyMetadata.from_props(props, source="policy.onnx")


def observations(values: dict[str, np.ndarray]) -> dict[int, DictObservation]:
    count = len(next(iter(values.values())))
    return {
        agent: DictObservation(
            episode_state=EpisodeState.RUNNING,
            array_data={key: value[agent] for key, value in values.items()},
            rewards={"reward": 0.0},
        )
        for agent in range(count)
    }


@pytest.mark.parametrize(
    ("family", "network", "spaces", "keys"),
    [
        (SoftActorCritic, lambda: sac_policy(6 * 5 * 3 + 2, 1), PIXEL_SPACES, ("camera", "speed")),
        (DoubleDQN, dqn_network, DQN_SPACES, ("obs",)),
    ],
)
def test_emotes_onnx_agent_acts_with_an_ml_agents_file_as_with_its_own(
    tmp_path: Path, family, network, spaces: MDPSpace, keys: tuple[str, ...]
) -> None:
    graph = family().policy_graph(network(), spaces)
    export_policy(graph, tmp_path / "emote.onnx", metadata=policy_metadata(graph))
    export(graph, tmp_path / "unity.onnx")
    own = OnnxAgentProxy(tmp_path / "emote.onnx", spaces=spaces)
    unity = OnnxAgentProxy(tmp_path / "unity.onnx", spaces=spaces)
    assert unity.metadata.profile is ExportProfile.ML_AGENTS and unity.input_names == keys

    rng = np.random.default_rng(6)
    batch = {
        key: (
            rng.integers(0, 256, size=(9, *space.shape), dtype=np.uint8)
            if space.dtype == np.uint8
            else rng.standard_normal((9, *space.shape), dtype=np.float32)
        )
        for key, space in spaces.state.spaces.items()
    }
    np.testing.assert_allclose(unity.act_batch(batch), own.act_batch(batch), atol=1e-5, rtol=0)
    seen = observations(batch)
    acted = [r.list_data["actions"] for r in unity(seen).values()]
    expected = [r.list_data["actions"] for r in own(seen).values()]
    np.testing.assert_allclose(np.stack(acted), np.stack(expected), atol=1e-5, rtol=0)


def test_observations_unity_cannot_send_are_refused() -> None:
    policy = sac_policy(4, 1)

    def spaces(**state: BoxSpace) -> MDPSpace:
        return MDPSpace(
            rewards=BoxSpace(np.float32, (1,)), actions=BoxSpace(np.float32, (1,)),
            state=DictSpace(state),
        )  # fmt: skip

    cases = {
        "of dtype int64": spaces(count=BoxSpace(np.int64, (4,))),
        "a discrete value": spaces(level=DiscreteSpace(n=3)),
        r"of shape \(1, 1, 2, 2\)": spaces(video=BoxSpace(np.float32, (1, 1, 2, 2))),
        "of dtype uint8": spaces(bytes=BoxSpace(np.uint8, (4,))),  # not an image
    }
    for message, space in cases.items():
        graph = SoftActorCritic().policy_graph(policy, space)
        with pytest.raises(ExportError, match=rf"`profile='ml-agents'` cannot express .*{message}"):
            ml_agents_graph(graph)


def test_a_graph_with_inputs_the_profile_has_no_place_for_is_refused() -> None:
    class GoalConditioned(torch.nn.Module):
        def forward(self, pos: torch.Tensor, grid: torch.Tensor, goal: torch.Tensor):
            return torch.tanh(pos[:, :2] + grid[:, 0, :2] + goal)

    graph = policy_graph(
        GoalConditioned(), algorithm="goal", spaces=SAC_SPACES, extra_inputs={"goal": (2,)}
    )
    with pytest.raises(ExportError, match=r"no input for the goal policy's 'goal'"):
        ml_agents_graph(graph)


@pytest.mark.parametrize("opset", [8, 16, 18])
def test_opsets_sentis_does_not_load_are_refused(opset: int) -> None:
    with pytest.raises(ConfigurationError, match=rf"opset {opset} .*choose 9 to 15"):
        check_ml_agents_opset(opset)


def test_the_checker_refuses_emotes_own_profile(tmp_path: Path) -> None:
    graph = SoftActorCritic().policy_graph(sac_policy(11, 2), SAC_SPACES)
    export_policy(graph, tmp_path / "emote.onnx", metadata=policy_metadata(graph))
    behaviour = Behaviour(sensors=[(3,), (2, 4)], continuous=2)
    assert unity_load_checks(tmp_path / "emote.onnx", behaviour, deterministic=True) == [
        'Required constant "version_number" was not found in the model file.'
    ]


MASKED_SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=DiscreteSpace(n=4),
    state=DictSpace(
        {"obs": BoxSpace(np.float32, (5,)), "action_mask": BoxSpace(np.int8, (4,), low=0, high=1)}
    ),
)


def test_an_env_action_mask_feeds_action_masks_not_an_observation(tmp_path: Path) -> None:
    graph = DoubleDQN().policy_graph(dqn_network(), MASKED_SPACES)
    export_policy(graph, tmp_path / "emote.onnx", metadata=policy_metadata(graph))
    report = export(graph, tmp_path / "unity.onnx")
    assert report.inputs == ["obs_0", "action_masks"]
    behaviour = Behaviour(sensors=[(5,)], branches=[4])
    assert unity_load_checks(tmp_path / "unity.onnx", behaviour, deterministic=True) == []

    own = OnnxAgentProxy(tmp_path / "emote.onnx", spaces=MASKED_SPACES)
    unity = OnnxAgentProxy(tmp_path / "unity.onnx", spaces=MASKED_SPACES)
    assert unity.metadata.action_mask_key == "action_mask" and unity.input_names == ("obs",)
    rng = np.random.default_rng(7)
    obs = rng.standard_normal((32, 5), dtype=np.float32)
    masks = rng.integers(0, 2, size=(32, 4)).astype(np.int8)
    masks[:, 2] = 1
    batch = {"obs": obs, "action_mask": masks}
    acted = unity.act_batch(batch)
    np.testing.assert_array_equal(acted, own.act_batch(batch))
    assert np.all(masks[np.arange(32), acted[:, 0]] == 1)
    with torch.no_grad():
        values = dqn_network().eval()(torch.from_numpy(obs)).numpy()
    assert np.any(masks[np.arange(32), values.argmax(axis=1)] == 0)  # the mask changed choices
