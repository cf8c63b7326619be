"""The module an ONNX export traces: an acting network wrapped to take one input per key.

Each algorithm family wraps its acting network in a :class:`KeyedInputs` module that takes one
tensor per observation key (and any inputs of its own, such as SAC's ``epsilon``) and flattens
them with :func:`~emote_core.nn.inputs.flatten_observation`, exactly as the agent proxies do
before calling the network. :func:`policy_graph` snapshots that module into a CPU, eval-mode copy
ready to trace, and :func:`policy_metadata` describes it for the file. The layout is documented
in :mod:`emote_core.onnx.format`. Nothing here knows an algorithm: the graph records the name of
the one that trained it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from emote_core.errors import ExportError
from emote_core.nn.inputs import flatten_observation
from emote_core.onnx.format import (
    ACTION_MASKS_INPUT,
    ACTION_RESCALE,
    ACTIONS_OUTPUT,
    PolicyMetadata,
)
from emote_core.proxies.generic import declared_noise_dim
from emote_core.spaces import BoxSpace, MDPSpace


class KeyedInputs(nn.Module):
    """Base of acting modules to export: one input tensor per observation key, then any others.

    :meth:`features` flattens the observation inputs with
    :func:`~emote_core.nn.inputs.flatten_observation`, exactly as the agent proxies do before
    calling a network.

    Args:
        keys: The observation keys, in input order.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__()
        self.keys = tuple(keys)

    def features(self, observations: Sequence[Tensor]) -> Tensor:
        """The observation inputs as one ``(batch, features)`` tensor."""
        return flatten_observation(dict(zip(self.keys, observations, strict=True)), self.keys)


@dataclass(frozen=True)
class PolicyGraph:
    """A snapshot of an acting network, ready to trace.

    Attributes:
        module: The wrapped CPU copy; positional inputs in :attr:`input_names` order.
        algorithm: The registered name of the algorithm that trained the network.
        spaces: The MDP space the network acts in (actions as the agents see them).
        input_names: Observation keys, then the algorithm's own inputs (SAC's ``epsilon``).
        input_shapes: The shape of one row of each input (no batch axis).
        output_names: ``actions``, then any others (DQN's ``q_values``).
        constant_outputs: Outputs that are the same tensor at every batch size, without a batch
            axis (the ``ml-agents`` profile's ``version_number``, say).
    """

    module: nn.Module
    algorithm: str
    spaces: MDPSpace
    input_names: tuple[str, ...]
    input_shapes: dict[str, tuple[int, ...]]
    output_names: tuple[str, ...]
    constant_outputs: tuple[str, ...] = ()

    def sample_inputs(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Standard-normal float32 inputs for ``batch`` rows, by input name; an
        ``action_masks`` input gets random 0/1 rows that allow at least one action each."""
        return {
            name: (
                sample_action_masks(batch, shape, rng)
                if name == ACTION_MASKS_INPUT
                else rng.standard_normal((batch, *shape), dtype=np.float32)
            )
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


def sample_action_masks(batch: int, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random float32 0/1 action masks of ``(batch, *shape)``, each row allowing at least one
    action (the parity check's inputs)."""
    masks = rng.integers(0, 2, size=(batch, *shape)).astype(np.float32)
    rows = masks.reshape(batch, -1)
    rows[np.arange(batch), rng.integers(0, rows.shape[1], size=batch)] = 1.0
    return rows.reshape(masks.shape)


def masked_argmax(values: Tensor, action_masks: Tensor) -> Tensor:
    """The index of the highest of ``values`` among the actions ``action_masks`` allows.

    The exported form of a discrete action mask, for any export profile to reuse: ``values`` is
    ``(batch, n)`` (Q values or logits); ``action_masks`` is ``(batch, n)``, float or integer,
    an entry above 0.5 allowing its action (the convention of ML-Agents' ``action_masks`` input
    for one discrete branch, and of PettingZoo's ``action_mask``). Traces to ONNX ``Where`` and
    ``ArgMax`` (opset 9 and up). A row that allows nothing gives action 0: a graph cannot
    raise, so emote's agents refuse such rows before running it.

    Returns:
        ``(batch, 1)`` int64 action indices.
    """
    allowed = action_masks > 0.5
    lowest = torch.finfo(values.dtype).min
    return torch.where(allowed, values, torch.full_like(values, lowest)).argmax(dim=1, keepdim=True)


def policy_graph(
    module: nn.Module,
    *,
    algorithm: str,
    spaces: MDPSpace,
    extra_inputs: Mapping[str, Sequence[int]] | None = None,
    output_names: Sequence[str] = (ACTIONS_OUTPUT,),
    observation_keys: Sequence[str] | None = None,
) -> PolicyGraph:
    """Snapshots an acting module (a CPU, eval-mode deep copy) into a traceable graph.

    The copy means training may go on changing the network inside ``module`` (and switching its
    mode) while the snapshot is traced. Algorithm families build ``module`` around their acting
    network (``AlgorithmFamily.policy_graph``).

    Args:
        module: Takes one tensor per observation key (``observation_keys``), then one per
            extra input; returns one tensor per output name (see :class:`KeyedInputs`).
        algorithm: The registered name of what trained it (recorded in the metadata).
        spaces: The MDP space the network acts in (``DictGymWrapper.spaces``).
        extra_inputs: Inputs after the observations, by name, with the shape of one row (SAC's
            ``epsilon`` noise, say).
        output_names: The module's outputs, in order; the first is ``actions``.
        observation_keys: The observation inputs, in order (default: every key of
            ``spaces.state``; DQN leaves out the action mask it takes as ``action_masks``).

    Raises:
        ExportError: If an extra input is named like an observation key, an observation key is
            not in ``spaces``, or the outputs do not start with ``actions``.
    """
    keys = tuple(spaces.state.keys()) if observation_keys is None else tuple(observation_keys)
    unknown = [key for key in keys if key not in spaces.state.spaces]
    if unknown:
        raise ExportError(
            f"observation input '{unknown[0]}' is not in the observation space, whose keys are "
            f"{spaces.state.keys()}"
        )
    extra = {name: tuple(int(d) for d in shape) for name, shape in (extra_inputs or {}).items()}
    clash = sorted(set(keys) & set(extra))
    if clash:
        raise ExportError(
            f"observation key '{clash[0]}' is also the name of an export input the policy "
            "takes besides observations; rename the observation key"
        )
    outputs = tuple(output_names)
    if not outputs or outputs[0] != ACTIONS_OUTPUT:
        raise ExportError(
            f"an exported policy's first output is '{ACTIONS_OUTPUT}'; got outputs {outputs}"
        )
    snapshot = copy.deepcopy(module).to("cpu").eval()
    snapshot.requires_grad_(False)
    shapes = {key: tuple(spaces.state[key].shape) for key in keys} | extra
    return PolicyGraph(snapshot, str(algorithm), spaces, tuple(shapes), shapes, outputs)


class _ProxyPolicy(nn.Module):
    """An agent proxy's policy called as the proxy calls it: one tensor per input name."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, *inputs: Tensor) -> Tensor:
        outputs = self.policy(*inputs)
        if isinstance(outputs, tuple | list):
            raise ExportError(
                f"the policy returned {len(outputs)} outputs in eval mode; an export of an agent "
                f"proxy's policy has one output, '{ACTIONS_OUTPUT}' — export through the "
                "algorithm's policy graph (graph=...) for more"
            )
        return outputs


def proxy_policy_graph(
    agent_proxy: Any, spaces: MDPSpace, *, requires_epsilon: bool
) -> PolicyGraph:
    """Snapshots the policy of any agent proxy into a traceable graph, as upstream emote's
    exporter read a proxy: inputs are the proxy's ``input_names`` (plus ``epsilon``, of the
    action's shape or the policy's ``noise_dim``, when ``requires_epsilon``), passed
    positionally; the output is ``actions``.

    Args:
        agent_proxy: Anything with a ``policy`` (a torch module) and ``input_names``.
        spaces: The MDP space; gives each input's shape.
        requires_epsilon: Whether the policy takes noise after the observations.

    Raises:
        ExportError: If the proxy lacks a policy or input names, an input is not in the
            observation space, or an observation key is named ``epsilon``.
    """
    policy = getattr(agent_proxy, "policy", None)
    names = getattr(agent_proxy, "input_names", None)
    if not isinstance(policy, nn.Module) or names is None:
        raise ExportError(
            f"{type(agent_proxy).__name__} cannot be exported: an agent proxy needs a 'policy' "
            "(a torch module) and 'input_names'"
        )
    state_keys = tuple(spaces.state.keys())
    missing = [name for name in names if name not in state_keys]
    if missing:
        raise ExportError(
            f"the proxy's inputs {missing} are not in the observation space, whose keys are "
            f"{list(state_keys)}"
        )
    shapes = {name: tuple(int(d) for d in spaces.state[name].shape) for name in names}
    if requires_epsilon:
        if "epsilon" in shapes:
            raise ExportError(
                "observation key 'epsilon' is also the name of the noise input; rename the key"
            )
        noise_dim = declared_noise_dim(policy)  # a latent policy's noise: latent-wide
        shapes["epsilon"] = (
            (noise_dim,) if noise_dim is not None else tuple(int(d) for d in spaces.actions.shape)
        )
    snapshot = copy.deepcopy(_ProxyPolicy(policy)).to("cpu").eval()
    snapshot.requires_grad_(False)
    return PolicyGraph(snapshot, "", spaces, tuple(shapes), shapes, (ACTIONS_OUTPUT,))


class _NormalizedInputs(nn.Module):
    """An acting module whose observation inputs are normalised first by constants:
    ``clip((x - mean) / std, -clip, clip)`` for the inputs that have them."""

    def __init__(
        self,
        module: nn.Module,
        names: Sequence[str],
        statistics: Mapping[str, tuple[Tensor, Tensor]],
        clip: float,
    ) -> None:
        super().__init__()
        self.module = module
        self.names = tuple(names)
        self.clip = float(clip)
        self.normalized = tuple(name in statistics for name in self.names)
        for position, name in enumerate(self.names):
            if name in statistics:
                mean, std = statistics[name]
                self.register_buffer(f"mean_{position}", mean.detach().float().clone())
                self.register_buffer(f"std_{position}", std.detach().float().clone())

    def forward(self, *inputs: Tensor) -> Any:
        values = []
        for position, value in enumerate(inputs):
            if self.normalized[position]:
                mean = getattr(self, f"mean_{position}")
                std = getattr(self, f"std_{position}")
                value = ((value - mean) / std).clamp(-self.clip, self.clip)
            values.append(value)
        return self.module(*values)


def normalized_policy_graph(graph: PolicyGraph, normalizer: nn.Module) -> PolicyGraph:
    """``graph`` with an observation normaliser's statistics inside, as constants: the graph
    takes raw observations.

    Args:
        graph: The acting module's graph.
        normalizer: Has ``snapshot()``, ``{input name: (mean, std)}`` of one entry's shape, and
            ``clip`` (an :class:`~emote_core.nn.normalization.ObservationNormalizer`); inputs
            it has no statistics for pass unchanged.
    """
    module = _NormalizedInputs(graph.module, graph.input_names, normalizer.snapshot(),
                               normalizer.clip)  # fmt: skip
    return dataclasses.replace(graph, module=module.eval())


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
    recipe_name: str = "",
    recipe_toml: str = "",
    env_action_space: Any = None,
    training_step: int = 0,
    checkpoint: str | Path | None = None,
) -> PolicyMetadata:
    """The metadata of an export of ``graph``.

    Args:
        graph: What is exported.
        recipe_name: The run's recipe's name.
        recipe_toml: The run's resolved recipe as TOML (``emote eval policy.onnx`` rebuilds the
            environment from it).
        env_action_space: The environment's own action space; defaults to the space the policy
            acts in.
        training_step: The update the weights come from.
        checkpoint: The checkpoint file exported, if any (its path and sha256 are recorded).
    """
    actions: BoxSpace = graph.spaces.actions
    masked = ACTION_MASKS_INPUT in graph.input_names
    return PolicyMetadata(
        action_mask_key=(graph.spaces.action_mask_key or "") if masked else "",
        algorithm=graph.algorithm,
        observation_space=graph.spaces.state,
        action_space=actions,
        action_bounds=action_bounds(env_action_space if env_action_space is not None else actions),
        input_names=graph.input_names,
        output_names=graph.output_names,
        recipe=recipe_name,
        recipe_toml=recipe_toml,
        training_step=int(training_step),
        source_checkpoint=str(checkpoint) if checkpoint is not None else "",
        source_checkpoint_sha256=file_sha256(checkpoint) if checkpoint is not None else "",
    )


__all__ = [
    "KeyedInputs",
    "PolicyGraph",
    "action_bounds",
    "file_sha256",
    "masked_argmax",
    "normalized_policy_graph",
    "policy_graph",
    "policy_metadata",
    "proxy_policy_graph",
    "sample_action_masks",
]
