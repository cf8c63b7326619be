"""The ``ml-agents`` export profile: an emote policy graph behind the tensor contract that Unity's
ML-Agents runtime (Sentis) checks when it loads a model.

:func:`ml_agents_graph` wraps the module of any :class:`~emote_core.onnx.graph.PolicyGraph` in
:class:`MlAgentsPolicy`: inputs ``obs_0 .. obs_{n-1}`` (images NCHW in ``[0, 1]``),
``epsilon`` and ``action_masks``; outputs ``version_number``, ``memory_size`` and the
continuous or discrete actions. The names are :class:`~emote_core.onnx.format.MlAgentsTensor`;
the layout is documented in ``docs/unity.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError, ExportError
from emote_core.onnx.format import (
    ACTION_MASKS_INPUT,
    ACTIONS_OUTPUT,
    EPSILON_INPUT,
    ML_AGENTS_MODEL_VERSION,
    Q_VALUES_OUTPUT,
    ExportProfile,
    MlAgentsObservation,
    MlAgentsTensor,
    PolicyMetadata,
    ml_agents_observation,
)
from emote_core.onnx.graph import PolicyGraph, masked_argmax
from emote_core.spaces import DiscreteSpace

ML_AGENTS_OPSETS = range(9, 16)
"""Opsets an ``ml-agents`` export is written in: Sentis reads 7 to 15, emote writes from 9."""

_CONTINUOUS_OUTPUTS = (
    MlAgentsTensor.VERSION_NUMBER,
    MlAgentsTensor.MEMORY_SIZE,
    MlAgentsTensor.CONTINUOUS_ACTIONS,
    MlAgentsTensor.CONTINUOUS_ACTION_OUTPUT_SHAPE,
    MlAgentsTensor.DETERMINISTIC_CONTINUOUS_ACTIONS,
)
_DISCRETE_OUTPUTS = (
    MlAgentsTensor.VERSION_NUMBER,
    MlAgentsTensor.MEMORY_SIZE,
    MlAgentsTensor.DISCRETE_ACTIONS,
    MlAgentsTensor.DISCRETE_ACTION_OUTPUT_SHAPE,
    MlAgentsTensor.DETERMINISTIC_DISCRETE_ACTIONS,
)
_CONSTANT_OUTPUTS = (
    MlAgentsTensor.VERSION_NUMBER,
    MlAgentsTensor.MEMORY_SIZE,
    MlAgentsTensor.CONTINUOUS_ACTION_OUTPUT_SHAPE,
    MlAgentsTensor.DISCRETE_ACTION_OUTPUT_SHAPE,
)


def check_ml_agents_opset(opset: int) -> int:
    """Returns ``opset`` if an ``ml-agents`` export can be written in it.

    Raises:
        ConfigurationError: Naming :data:`ML_AGENTS_OPSETS`.
    """
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in ML_AGENTS_OPSETS:
        raise ConfigurationError(
            f"opset {opset!r} is not one Unity's inference engine (Sentis) loads for the "
            f"ml-agents profile; choose {ML_AGENTS_OPSETS.start} to {ML_AGENTS_OPSETS.stop - 1}"
        )
    return opset


class MlAgentsPolicy(nn.Module):
    """An emote acting module called with ML-Agents' inputs, returning ML-Agents' outputs.

    Args:
        policy: The emote graph's module: observations in ``observation_keys`` order, then its
            extra inputs in ``extras`` order.
        observation_keys: The observation key behind each ``obs_i``.
        observations: How each ``obs_i`` becomes the entry the policy reads.
        extras: The policy's inputs after the observations (``epsilon``, ``action_masks``).
        policy_outputs: The policy's outputs (``actions``, then others such as ``q_values``).
        action_size: Continuous actions per row, or ``None`` for discrete actions.
        branch_size: The number of discrete actions (one branch), or ``None``.
    """

    def __init__(
        self,
        policy: nn.Module,
        observation_keys: Sequence[str],
        observations: Sequence[MlAgentsObservation],
        *,
        extras: Sequence[str],
        policy_outputs: Sequence[str],
        action_size: int | None,
        branch_size: int | None,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.observation_keys = tuple(observation_keys)
        self.observations = tuple(observations)
        self.extras = tuple(extras)
        self.policy_outputs = tuple(policy_outputs)
        self.discrete = branch_size is not None
        self.register_buffer("version_number", torch.tensor([float(ML_AGENTS_MODEL_VERSION)]))
        self.register_buffer("memory_size", torch.tensor([0.0]))
        # ML-Agents writes the branch sizes as a (1, branches) row, the action size as (1,).
        shape = [[float(branch_size)]] if self.discrete else [float(action_size or 0)]
        self.register_buffer("action_output_shape", torch.tensor(shape))

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        count = len(self.observations)
        entries = [
            self._entry(value, layout)
            for value, layout in zip(inputs[:count], self.observations, strict=True)
        ]
        rest = inputs[count:]
        if self.discrete:
            return self._discrete(entries, masks=rest[0])
        return self._continuous(entries, noise=rest[0] if rest else None)

    @staticmethod
    def _entry(value: Tensor, layout: MlAgentsObservation) -> Tensor:
        if layout.image:
            value = value.permute(0, 2, 3, 1)  # NCHW -> emote's (batch, height, width, channels)
        return value * layout.scale if layout.scale != 1.0 else value

    def _call(self, entries: list[Tensor], **extras: Tensor) -> dict[str, Tensor]:
        outputs = self.policy(*entries, *(extras[name] for name in self.extras))
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        return dict(zip(self.policy_outputs, outputs, strict=True))

    def _continuous(self, entries: list[Tensor], noise: Tensor | None) -> tuple[Tensor, ...]:
        if noise is None:  # a policy without noise acts the same either way
            sampled = deterministic = self._call(entries)[ACTIONS_OUTPUT]
        else:
            sampled = self._call(entries, epsilon=noise)[ACTIONS_OUTPUT]
            deterministic = self._call(entries, epsilon=torch.zeros_like(noise))[ACTIONS_OUTPUT]
        return (
            self.version_number, self.memory_size, sampled, self.action_output_shape,
            deterministic,
        )  # fmt: skip

    def _discrete(self, entries: list[Tensor], masks: Tensor) -> tuple[Tensor, ...]:
        if ACTION_MASKS_INPUT in self.extras:  # the policy masks its own choice
            actions = self._call(entries, action_masks=masks)[ACTIONS_OUTPUT]
        else:
            actions = masked_argmax(self._call(entries)[Q_VALUES_OUTPUT], masks)
        return (
            self.version_number, self.memory_size, actions, self.action_output_shape,
            actions.clone(),  # the same action: a greedy policy has no other
        )  # fmt: skip


def ml_agents_graph(graph: PolicyGraph) -> PolicyGraph:
    """The ``ml-agents`` profile of an emote policy graph (see the module's docstring).

    Raises:
        ExportError: If an observation cannot be expressed to Unity (see
            :func:`~emote_core.onnx.format.ml_agents_observation`), the actions are not one
            discrete branch or a vector of floats, or the graph needs inputs this profile has no
            place for (anything but observations, ``epsilon`` and ``action_masks``), or a discrete
            graph neither takes ``action_masks`` nor gives ``q_values`` to mask.
    """
    spaces = graph.spaces
    keys = [name for name in graph.input_names if name in spaces.state.spaces]
    extras = [name for name in graph.input_names if name not in spaces.state.spaces]
    unknown = [name for name in extras if name not in (EPSILON_INPUT, ACTION_MASKS_INPUT)]
    if unknown:
        raise ExportError(
            f"`profile='ml-agents'` has no input for the {graph.algorithm} policy's "
            f"'{unknown[0]}' (it feeds observations, '{EPSILON_INPUT}' noise and "
            f"'{ACTION_MASKS_INPUT}'); export with `profile='emote'`"
        )
    if graph.input_names[: len(keys)] != tuple(keys):
        raise ExportError(
            f"the {graph.algorithm} policy takes inputs {list(graph.input_names)}, not its "
            "observations first; `profile='ml-agents'` cannot order them — export with "
            "`profile='emote'`"
        )
    layouts = [ml_agents_observation(key, spaces.state[key]) for key in keys]
    names = [f"{MlAgentsTensor.OBSERVATION_PREFIX}{index}" for index in range(len(keys))]
    shapes = {name: layout.shape for name, layout in zip(names, layouts, strict=True)}
    actions = spaces.actions
    if isinstance(actions, DiscreteSpace):
        if EPSILON_INPUT in extras:
            raise ExportError(
                f"the {graph.algorithm} policy draws '{EPSILON_INPUT}' noise for discrete "
                "actions, which ML-Agents' discrete outputs have no place for; export with "
                "`profile='emote'`"
            )
        if ACTION_MASKS_INPUT not in extras and Q_VALUES_OUTPUT not in graph.output_names:
            raise ExportError(
                f"the {graph.algorithm} policy gives neither masked actions nor "
                f"'{Q_VALUES_OUTPUT}' to mask; `profile='ml-agents'` needs one — export with "
                "`profile='emote'`"
            )
        shapes[MlAgentsTensor.ACTION_MASKS] = (int(actions.n),)
        outputs, action_size, branch_size = _DISCRETE_OUTPUTS, None, int(actions.n)
    else:
        if len(actions.shape) != 1:
            raise ExportError(
                f"`profile='ml-agents'` sends continuous actions as one vector per agent; the "
                f"{graph.algorithm} policy acts with shape {actions.shape} — export with "
                "`profile='emote'`"
            )
        if EPSILON_INPUT in extras:
            shapes[MlAgentsTensor.EPSILON] = graph.input_shapes[EPSILON_INPUT]
        outputs, action_size, branch_size = _CONTINUOUS_OUTPUTS, int(actions.shape[0]), None
    module = MlAgentsPolicy(
        graph.module, keys, layouts, extras=extras, policy_outputs=graph.output_names,
        action_size=action_size, branch_size=branch_size,
    ).eval()  # fmt: skip
    return PolicyGraph(
        module=module, algorithm=graph.algorithm, spaces=spaces, input_names=tuple(shapes),
        input_shapes=shapes, output_names=tuple(str(name) for name in outputs),
        constant_outputs=tuple(str(name) for name in _CONSTANT_OUTPUTS if name in outputs),
    )  # fmt: skip


def ml_agents_metadata(metadata: PolicyMetadata, graph: PolicyGraph) -> PolicyMetadata:
    """The metadata of an ``ml-agents`` export: ``metadata`` (of ``graph``, from
    :func:`~emote_core.onnx.graph.policy_metadata`) with the profile and the observation key
    behind each ``obs_i``."""
    module = graph.module
    if not isinstance(module, MlAgentsPolicy):
        raise ExportError("ml_agents_metadata describes a graph made by ml_agents_graph")
    return replace(
        metadata, profile=ExportProfile.ML_AGENTS, profile_observations=module.observation_keys
    )


__all__ = [
    "ML_AGENTS_OPSETS",
    "MlAgentsPolicy",
    "check_ml_agents_opset",
    "ml_agents_graph",
    "ml_agents_metadata",
]
