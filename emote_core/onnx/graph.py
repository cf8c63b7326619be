"""The module an ONNX export traces: an acting network wrapped to take one input per key.

:func:`policy_graph` snapshots a run's acting network (the SAC policy or DQN's Q network) into a
CPU, eval-mode copy wrapped so that it takes one tensor per observation key (and ``epsilon`` for
SAC) and flattens them with :func:`~emote_core.nn.inputs.flatten_observation`, exactly as the
agent proxies do before calling the network. :func:`policy_metadata` describes it for the file.
The layout is documented in :mod:`emote_core.onnx.format`.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from emote_core.errors import ExportError
from emote_core.nn.inputs import flatten_observation
from emote_core.onnx.format import (
    ACTION_RESCALE,
    ACTIONS_OUTPUT,
    EPSILON_INPUT,
    Q_VALUES_OUTPUT,
    PolicyMetadata,
)
from emote_core.recipes.schema import Algorithm, Recipe
from emote_core.spaces import BoxSpace, DiscreteSpace, MDPSpace


class _GaussianActing(nn.Module):
    """``(*observations, epsilon) -> actions``: the policy's eval-mode forward."""

    def __init__(self, policy: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.policy = policy
        self.keys = keys

    def forward(self, *inputs: Tensor) -> Tensor:
        *observations, epsilon = inputs
        features = flatten_observation(dict(zip(self.keys, observations, strict=True)), self.keys)
        return self.policy(features, epsilon)


class _GreedyActing(nn.Module):
    """``(*observations) -> (actions, q_values)``: the greedy action of a Q network."""

    def __init__(self, q_network: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.q_network = q_network
        self.keys = keys

    def forward(self, *observations: Tensor) -> tuple[Tensor, Tensor]:
        features = flatten_observation(dict(zip(self.keys, observations, strict=True)), self.keys)
        values = self.q_network(features)
        return values.argmax(dim=1, keepdim=True), values


@dataclass(frozen=True)
class PolicyGraph:
    """A snapshot of an acting network, ready to trace.

    Attributes:
        module: The wrapped CPU copy; positional inputs in :attr:`input_names` order.
        algorithm: What trained the network.
        spaces: The MDP space the network acts in (actions as the agents see them).
        input_names: Observation keys, then ``epsilon`` for SAC.
        input_shapes: The shape of one row of each input (no batch axis).
        output_names: ``actions`` (and ``q_values`` for DQN).
    """

    module: nn.Module
    algorithm: Algorithm
    spaces: MDPSpace
    input_names: tuple[str, ...]
    input_shapes: dict[str, tuple[int, ...]]
    output_names: tuple[str, ...]

    def sample_inputs(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Standard-normal float32 inputs for ``batch`` rows, by input name."""
        return {
            name: rng.standard_normal((batch, *shape), dtype=np.float32)
            for name, shape in self.input_shapes.items()
        }

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What the torch module outputs for ``inputs``, by output name."""
        self.module.eval()
        with torch.no_grad():
            outputs = self.module(*(torch.from_numpy(inputs[n]) for n in self.input_names))
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        return {name: out.numpy() for name, out in zip(self.output_names, outputs, strict=True)}


def policy_graph(network: nn.Module, *, algorithm: Algorithm, spaces: MDPSpace) -> PolicyGraph:
    """Snapshots ``network`` (a CPU, eval-mode deep copy) into a traceable :class:`PolicyGraph`.

    The copy means training may go on changing ``network`` (and switching its mode) while the
    snapshot is traced.

    Args:
        network: The SAC policy (``forward(features, epsilon)`` in eval mode) or DQN's Q network
            (``forward(features) -> (B, num_actions)``).
        algorithm: Which of the two it is.
        spaces: The MDP space the network acts in (``DictGymWrapper.spaces``).

    Raises:
        ExportError: If an observation key is named ``epsilon``, or the action space does not
            fit the algorithm.
    """
    keys = tuple(spaces.state.keys())
    if EPSILON_INPUT in keys:
        raise ExportError(
            f"an observation key is named '{EPSILON_INPUT}', which exports reserve for the noise "
            "input; rename the observation key"
        )
    discrete = isinstance(spaces.actions, DiscreteSpace)
    if discrete != (algorithm is Algorithm.DQN):
        raise ExportError(
            f"a {algorithm} network cannot act in {spaces.actions.to_json()['type']} action "
            "spaces; export with the algorithm that trained it"
        )
    snapshot = copy.deepcopy(network).to("cpu").eval()
    snapshot.requires_grad_(False)
    shapes = {key: tuple(spaces.state[key].shape) for key in keys}
    if algorithm is Algorithm.SAC:
        module: nn.Module = _GaussianActing(snapshot, keys)
        shapes[EPSILON_INPUT] = tuple(spaces.actions.shape)
        outputs: tuple[str, ...] = (ACTIONS_OUTPUT,)
    else:
        module = _GreedyActing(snapshot, keys)
        outputs = (ACTIONS_OUTPUT, Q_VALUES_OUTPUT)
    return PolicyGraph(module.eval(), algorithm, spaces, tuple(shapes), shapes, outputs)


def action_bounds(env_action_space: Any) -> dict[str, Any]:
    """The environment's own action bounds, as the ``action_bounds`` metadata records them.

    Args:
        env_action_space: The environment's action space (gymnasium ``Box``/``Discrete``, or an
            emote ``BoxSpace``/``DiscreteSpace``).

    Returns:
        ``{"n", "start"}`` for discrete spaces; ``{"low", "high", "rescale"}`` for boxes, where
        ``rescale`` is the formula from the policy's ``actions`` to environment actions and
        unbounded entries are ``None``.
    """
    n = getattr(env_action_space, "n", None)
    if n is not None:
        return {"n": int(n), "start": int(getattr(env_action_space, "start", 0))}
    shape = tuple(env_action_space.shape)
    return {
        "low": _finite_or_none(env_action_space.low, shape),
        "high": _finite_or_none(env_action_space.high, shape),
        "rescale": ACTION_RESCALE,
    }


def _finite_or_none(bound: Any, shape: tuple[int, ...]) -> list[Any]:
    """A bound as a nested list, unbounded entries as ``None`` (JSON has no infinity)."""
    if bound is None:
        return np.full(shape, None, dtype=object).tolist()
    values = np.broadcast_to(np.asarray(bound, dtype=np.float64), shape)
    return np.where(np.isfinite(values), values, None).tolist()


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def policy_metadata(
    graph: PolicyGraph,
    *,
    recipe: Recipe | None = None,
    env_action_space: Any = None,
    training_step: int = 0,
    checkpoint: str | Path | None = None,
) -> PolicyMetadata:
    """The metadata of an export of ``graph``.

    Args:
        graph: What is exported.
        recipe: The run's recipe (its name and TOML go into the file).
        env_action_space: The environment's own action space; defaults to the space the policy
            acts in.
        training_step: The update the weights come from.
        checkpoint: The checkpoint file exported, if any (its path and sha256 are recorded).
    """
    from emote_core.recipes.loading import recipe_to_toml

    actions: BoxSpace = graph.spaces.actions
    return PolicyMetadata(
        algorithm=graph.algorithm,
        observation_space=graph.spaces.state,
        action_space=actions,
        action_bounds=action_bounds(env_action_space if env_action_space is not None else actions),
        input_names=graph.input_names,
        output_names=graph.output_names,
        recipe=recipe.name if recipe is not None else "",
        recipe_toml=recipe_to_toml(recipe) if recipe is not None else "",
        training_step=int(training_step),
        source_checkpoint=str(checkpoint) if checkpoint is not None else "",
        source_checkpoint_sha256=file_sha256(checkpoint) if checkpoint is not None else "",
    )


__all__ = ["PolicyGraph", "action_bounds", "file_sha256", "policy_graph", "policy_metadata"]
