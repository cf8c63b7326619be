"""OnnxAgentProxy: acting with an exported policy file through onnxruntime, without torch models.

The proxy reads the file's metadata (:mod:`emote_core.onnx.format`) and maps observations to
actions as the torch proxies do (``epsilon`` zeros when deterministic, standard-normal noise
from a numpy generator when stochastic); an ``ml-agents`` profile export is fed as Unity would
feed it. Deterministic agents act exactly as the torch ones; stochastic ones draw other noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from emote_core.errors import ConfigurationError, FormatError
from emote_core.onnx.format import (
    ACTION_MASKS_INPUT,
    ACTIONS_OUTPUT,
    EPSILON_INPUT,
    MAX_POLICY_BYTES,
    ExportProfile,
    MlAgentsTensor,
    PolicyMetadata,
    ml_agents_observation,
)
from emote_core.proxies.base import acting_agents
from emote_core.proxies.epsilon_greedy import allowed_actions
from emote_core.spaces import DiscreteSpace, MDPSpace, describe_shape, describe_space
from emote_core.typing import AgentId, DictObservation, DictResponse
from emote_core.utils.files import read_regular_file


def is_onnx_file(path: str | Path) -> bool:
    """Whether ``path`` names an ONNX file (by its ``.onnx`` suffix)."""
    return Path(path).suffix.lower() == ".onnx"


class OnnxAgentProxy:
    """Acts for many agents with one onnxruntime call on an emote policy export.

    Args:
        path: The ``.onnx`` file written by ``emote export onnx`` or ``OnnxExporter``.
        deterministic: Feed zero noise (the mean action); else standard-normal noise. Ignored by
            DQN exports, which act greedily.
        seed: Seeds the noise; ``None`` draws from fresh entropy.
        spaces: When given, the environment's MDP space is checked against the file's up front
            (observation keys and shapes, action shape).
        threads: onnxruntime's intra-op threads; one is fastest for small batches.

    Raises:
        ConfigurationError: If the file does not exist or does not fit ``spaces``.
        FormatError: If it is not a regular file (a named pipe, a device), holds more than
            :data:`~emote_core.onnx.format.MAX_POLICY_BYTES`, or is not a loadable emote policy
            export.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        deterministic: bool = True,
        seed: int | None = None,
        spaces: MDPSpace | None = None,
        threads: int = 1,
    ) -> None:
        import onnxruntime

        self.path = Path(path)
        try:  # read once, checked before reading: a pipe or /dev/zero is never read
            data = read_regular_file(
                self.path,
                limit=MAX_POLICY_BYTES,
                rule="pass the .onnx file that `emote export onnx` or a training run wrote",
            )
        except FileNotFoundError:
            raise ConfigurationError(f"ONNX policy '{self.path}' does not exist") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(
                data, options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises its own untyped errors for bad files
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise FormatError(f"onnxruntime cannot load '{self.path}': {first}") from error
        self.metadata = PolicyMetadata.from_props(
            self.session.get_modelmeta().custom_metadata_map, source=str(self.path)
        )
        self.deterministic = bool(deterministic)
        self._rng = np.random.default_rng(seed)
        self._keys = self.metadata.observation_keys
        self._shapes = {key: self.metadata.observation_space[key].shape for key in self._keys}
        # An ml-agents export takes action_masks whether or not the env gives a mask.
        self._mask_key = self.metadata.action_mask_key or None
        self._action_shape = tuple(self.metadata.action_space.shape)
        self._action_dtype = self.metadata.action_space.dtype
        self._noise_shape = self._action_shape  # SAC's; a latent policy's noise is latent-wide
        for graph_input in self.session.get_inputs():
            if graph_input.name == EPSILON_INPUT and all(
                isinstance(d, int) for d in graph_input.shape[1:]
            ):
                self._noise_shape = tuple(graph_input.shape[1:])
        if spaces is not None:
            self.check_spaces(spaces)

    def random_generators(self) -> dict[str, np.random.Generator]:
        """Its exploration draws, for checkpoints."""
        return {"actions": self._rng}

    @property
    def input_names(self) -> tuple[str, ...]:
        """The observation keys the policy reads."""
        return self._keys

    @property
    def output_names(self) -> tuple[str, ...]:
        """``("actions",)``."""
        return (ACTIONS_OUTPUT,)

    def check_spaces(self, spaces: MDPSpace) -> None:
        """Checks that an environment gives what the policy reads and takes what it produces.

        Raises:
            ConfigurationError: Naming the mismatch.
        """
        given = spaces.state.spaces
        shapes = dict(self._shapes)
        if self._mask_key is not None:
            shapes[self._mask_key] = self.metadata.observation_space[self._mask_key].shape
        for key, shape in shapes.items():
            if key not in given or given[key].shape != shape:
                gives = describe_space(given[key]) if key in given else "none"
                raise ConfigurationError(
                    f"policy '{self.path}' reads observations '{key}' of "
                    f"{describe_shape(shape)}; the environment gives {gives} — run it on the "
                    "environment it was trained on"
                )
        discrete = isinstance(spaces.actions, DiscreteSpace)
        mismatch = discrete != self.metadata.discrete or (
            tuple(spaces.actions.shape) != self._action_shape
            or (discrete and spaces.actions.n != self.metadata.action_space.n)  # type: ignore[attr-defined]
        )
        if mismatch:
            raise ConfigurationError(
                f"policy '{self.path}' acts with {describe_space(self.metadata.action_space)}; "
                f"the environment takes {describe_space(spaces.actions)} — run it on the "
                "environment it was trained on"
            )

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Responds to every ``INITIAL`` and ``RUNNING`` observation.

        Raises:
            ConfigurationError: If an observation lacks a key the policy reads or has another
                shape.
        """
        agents = acting_agents(observations)
        if not agents:
            return {}
        feed = {key: self._stack(key, agents, observations) for key in self._keys}
        if self._mask_key is not None:
            masks = self._stack(self._mask_key, agents, observations)
            feed[ACTION_MASKS_INPUT] = self._masks(masks, [f"agent {a}" for a in agents])
        actions = self._run(feed, len(agents))
        return {
            agent: DictResponse(list_data={ACTIONS_OUTPUT: actions[row]})
            for row, agent in enumerate(agents)
        }

    def act_batch(self, observations: Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions for a batch, ``{key: (B, ...)}`` in, ``(B, ...)`` out, as :meth:`__call__`.

        Raises:
            ConfigurationError: If a key the policy reads is missing or has rows of another shape.
        """
        feed = {}
        keys = self._keys if self._mask_key is None else (*self._keys, self._mask_key)
        for key in keys:
            if key not in observations:
                raise ConfigurationError(
                    f"the observations have no '{key}' (they have {sorted(observations)}); "
                    f"policy '{self.path}' reads {list(self._keys)}"
                )
            batch = np.asarray(observations[key], dtype=np.float32)
            if key == self._mask_key:
                names = [f"row {row}" for row in range(len(batch))]
                feed[ACTION_MASKS_INPUT] = self._masks(batch, names)
                continue
            if batch.shape[1:] != self._shapes[key]:
                raise ConfigurationError(
                    f"observation '{key}' has rows of shape {batch.shape[1:]}; policy "
                    f"'{self.path}' reads {self._shapes[key]} — run it on the environment it was "
                    "trained on"
                )
            feed[key] = batch
        return self._run(feed, len(next(iter(feed.values()))))

    def _masks(self, masks: np.ndarray, rows: list[str]) -> np.ndarray:
        """The ``action_masks`` input: float32 0/1, checked to allow an action in every row."""
        allowed = allowed_actions(masks, int(self.metadata.action_space.n), rows)  # type: ignore[attr-defined]
        return allowed.astype(np.float32)

    def _run(self, feed: dict[str, np.ndarray], count: int) -> np.ndarray:
        if self.metadata.stochastic:
            shape = (count, *self._noise_shape)
            feed[EPSILON_INPUT] = (
                np.zeros(shape, dtype=np.float32)
                if self.deterministic
                else self._rng.standard_normal(shape, dtype=np.float32)
            )
        output = ACTIONS_OUTPUT
        if self.metadata.profile is ExportProfile.ML_AGENTS:
            feed, output = self._ml_agents_feed(feed, count)
        (actions,) = self.session.run([output], feed)
        return np.asarray(actions).astype(self._action_dtype, copy=False)

    def _ml_agents_feed(
        self, feed: dict[str, np.ndarray], count: int
    ) -> tuple[dict[str, np.ndarray], str]:
        """An emote feed renamed to the ``ml-agents`` profile's inputs (``obs_i``, images NCHW
        in Unity's pixel scale; all-ones ``action_masks`` when the env gives no mask) and the
        output to act with: ``deterministic_*`` when deterministic, else the sampled one."""
        renamed = {}
        for index, key in enumerate(self._keys):
            layout = ml_agents_observation(key, self.metadata.observation_space[key])
            value = feed[key]
            if layout.image:  # (batch, height, width, channels) -> (batch, channels, h, w)
                value = np.ascontiguousarray(value.transpose(0, 3, 1, 2))
            renamed[f"{MlAgentsTensor.OBSERVATION_PREFIX}{index}"] = value / np.float32(
                layout.scale
            )
        for name in (EPSILON_INPUT, ACTION_MASKS_INPUT):
            if name in feed:
                renamed[name] = feed[name]
        if self.metadata.discrete:
            n = int(self.metadata.action_space.n)  # type: ignore[attr-defined]
            renamed.setdefault(ACTION_MASKS_INPUT, np.ones((count, n), dtype=np.float32))
            sampled = MlAgentsTensor.DISCRETE_ACTIONS
            deterministic = MlAgentsTensor.DETERMINISTIC_DISCRETE_ACTIONS
        else:
            sampled = MlAgentsTensor.CONTINUOUS_ACTIONS
            deterministic = MlAgentsTensor.DETERMINISTIC_CONTINUOUS_ACTIONS
        return renamed, str(deterministic if self.deterministic else sampled)

    def _stack(
        self, key: str, agents: list[AgentId], observations: Mapping[AgentId, DictObservation]
    ) -> np.ndarray:
        shape = self.metadata.observation_space[key].shape
        rows = []
        for agent in agents:
            data = observations[agent].array_data
            if key not in data:
                raise ConfigurationError(
                    f"the observation of agent {agent} has no '{key}' (it has {sorted(data)}); "
                    f"policy '{self.path}' reads {list(self._keys)}"
                )
            value = np.asarray(data[key])
            if value.shape != shape:
                raise ConfigurationError(
                    f"observation '{key}' of agent {agent} has shape {value.shape}; policy "
                    f"'{self.path}' reads {shape} — run it on the environment it was trained on"
                )
            rows.append(value)
        return np.stack(rows).astype(np.float32, copy=False)

    def __repr__(self) -> str:
        return (
            f"OnnxAgentProxy({str(self.path)!r}, inputs={list(self._keys)}, "
            f"deterministic={self.deterministic})"
        )


__all__ = ["OnnxAgentProxy", "is_onnx_file"]
