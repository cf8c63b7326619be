"""The emote ONNX policy format: tensor names, metadata keys and the metadata an export carries.

An exported policy is one self-contained ``.onnx`` file: one float32 input per observation key
(plus ``epsilon`` for SAC, ``action_masks`` for masked DQN), the ``actions`` output (and
``q_values`` for DQN), a dynamic batch axis 0, and string metadata props (:class:`MetadataKey`).
The ``ml-agents`` profile (:class:`ExportProfile`) writes the same policy behind Unity's tensor
names (:class:`MlAgentsTensor`). This module imports neither torch nor onnx.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

import numpy as np

from emote_core import __version__
from emote_core.errors import ConfigurationError, ExportError, FormatError
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, space_from_json

FORMAT_NAME = "emote-policy"
"""The ``format`` metadata prop of every emote policy export."""
EPSILON_INPUT = "epsilon"
"""The noise input of stochastic (SAC) policies."""
ACTION_MASKS_INPUT = "action_masks"
"""The discrete action mask input (``[batch, num_actions]``, 1 = allowed), ML-Agents' name."""
ACTIONS_OUTPUT = "actions"
"""The output the environment acts with."""
Q_VALUES_OUTPUT = "q_values"
"""DQN's second output: one value per discrete action."""
BATCH_AXIS = "batch"
"""The name of the dynamic leading axis of every input and output."""
ACTION_RESCALE = "env_action = low + (actions + 1) * (high - low) / 2"
"""How an engine maps SAC's ``actions`` in ``[-1, 1]`` onto the environment's bounds."""
MAX_POLICY_BYTES = 2**31 - 1
"""The largest ``.onnx`` file emote reads: protobuf's limit for a model that keeps its weights
inside the file, as emote's exports do."""


class OnnxPolicyVersion(IntEnum):
    """Versions of the emote policy export (its ``format_version`` metadata prop)."""

    V1 = 1
    """Inputs, outputs and metadata as described in this module's docstring."""
    V2 = 2
    """V1 plus the ``action_masks`` input and the ``action_mask_key`` prop; written only by
    policies that take a mask, so every other export stays V1."""
    V3 = 3
    """V2 plus the ``profile`` and ``observation_keys`` props: written only for the
    ``ml-agents`` profile, whose inputs are not named after observation keys."""
    LATEST = V3


class ExportProfile(StrEnum):
    """The tensor contract an export follows."""

    EMOTE = "emote"
    """Inputs named after observation keys (and ``epsilon``, ``action_masks``); ``actions`` out."""
    ML_AGENTS = "ml-agents"
    """What Unity's ML-Agents runtime (Sentis) loads: see :class:`MlAgentsTensor`."""


class MlAgentsTensor(StrEnum):
    """Tensor names of the ``ml-agents`` profile, as ML-Agents' exporter writes them
    (``TensorNames`` in ``mlagents/trainers/torch_entities/model_serialization.py``)."""

    OBSERVATION_PREFIX = "obs_"
    """``obs_0``, ``obs_1``, ...: one float input per observation key, images NCHW."""
    ACTION_MASKS = ACTION_MASKS_INPUT
    """Discrete actions only: ``(batch, n)`` floats, 1 where an action is allowed."""
    EPSILON = EPSILON_INPUT
    """Stochastic continuous policies: standard-normal noise, which Unity's runtime fills."""
    VERSION_NUMBER = "version_number"
    MEMORY_SIZE = "memory_size"
    CONTINUOUS_ACTIONS = "continuous_actions"
    CONTINUOUS_ACTION_OUTPUT_SHAPE = "continuous_action_output_shape"
    DETERMINISTIC_CONTINUOUS_ACTIONS = "deterministic_continuous_actions"
    DISCRETE_ACTIONS = "discrete_actions"
    DISCRETE_ACTION_OUTPUT_SHAPE = "discrete_action_output_shape"
    DETERMINISTIC_DISCRETE_ACTIONS = "deterministic_discrete_actions"


ML_AGENTS_MODEL_VERSION = 3
"""The ``version_number`` written: ML-Agents 2.x's model API (Unity loads versions 2 and 3)."""
ML_AGENTS_PIXEL_SCALE = 255.0
"""Unity's sensors write pixels as floats in ``[0, 1]``; emote's ``uint8`` images hold 0-255."""


@dataclass(frozen=True)
class MlAgentsObservation:
    """How one observation entry becomes an ``obs_i`` input of the ``ml-agents`` profile.

    Attributes:
        shape: The input's shape per row: the entry's, images (rank 3) channels first.
        image: Whether the entry is a ``(height, width, channels)`` image, sent ``NCHW``.
        scale: What the graph multiplies the input by to get emote's values (255 for ``uint8``
            images, which Unity sends in ``[0, 1]``; else 1).
    """

    shape: tuple[int, ...]
    image: bool
    scale: float


def ml_agents_observation(key: str, space: BoxSpace) -> MlAgentsObservation:
    """How observation entry ``key`` is sent to an ``ml-agents`` export.

    Raises:
        ExportError: If the entry is discrete, has no axis or more than three, or holds
            non-float values other than ``uint8`` images.
    """
    shape = tuple(space.shape)
    image = len(shape) == 3
    if isinstance(space, DiscreteSpace) or not 1 <= len(shape) <= 3:
        what = "a discrete value" if isinstance(space, DiscreteSpace) else f"of shape {shape}"
        raise ExportError(
            f"`profile='ml-agents'` cannot express observation '{key}' ({what}): Unity sensors "
            "send float vectors, grids or images of 1 to 3 axes; wrap the env to give one, or "
            "export with `profile='emote'`"
        )
    if not np.issubdtype(space.dtype, np.floating) and not (image and space.dtype == np.uint8):
        raise ExportError(
            f"`profile='ml-agents'` cannot express observation '{key}' of dtype {space.dtype}: "
            "Unity sends floats (and uint8 images as floats in [0, 1]); wrap the env to give "
            "float32, or export with `profile='emote'`"
        )
    if image:
        height, width, channels = shape
        shape = (channels, height, width)
    scale = ML_AGENTS_PIXEL_SCALE if space.dtype == np.uint8 else 1.0
    return MlAgentsObservation(shape=shape, image=image, scale=scale)


class MetadataKey(StrEnum):
    """The metadata props emote writes into every export."""

    FORMAT = "format"
    FORMAT_VERSION = "format_version"
    EMOTE_VERSION = "emote_version"
    ALGORITHM = "algorithm"
    RECIPE = "recipe"
    """The recipe's name."""
    RECIPE_TOML = "recipe_toml"
    """The resolved recipe as TOML: ``emote eval policy.onnx`` rebuilds the environment from it."""
    OBSERVATION_SPACE = "observation_space"
    """JSON: the dict space of observations, one entry per observation input."""
    ACTION_SPACE = "action_space"
    """JSON: the action space as the policy acts in it (``[-1, 1]`` boxes for SAC)."""
    ACTION_BOUNDS = "action_bounds"
    """JSON: the environment's own bounds: ``{low, high, rescale}`` for boxes, ``{n, start}`` for
    discrete actions."""
    INPUT_NAMES = "input_names"
    OUTPUT_NAMES = "output_names"
    TRAINING_STEP = "training_step"
    """The ``bp_step`` the weights come from."""
    SOURCE_CHECKPOINT = "source_checkpoint"
    SOURCE_CHECKPOINT_SHA256 = "source_checkpoint_sha256"
    OPSET = "opset"
    ACTION_MASK_KEY = "action_mask_key"
    """The observation key fed to the ``action_masks`` input (V2; absent without one)."""
    PROFILE = "profile"
    """The :class:`ExportProfile` (V3; ``emote`` when absent)."""
    OBSERVATION_KEYS = "observation_keys"
    """JSON, ``ml-agents`` profile (V3): the observation key behind each ``obs_i``, in order."""


EMOTE_METADATA_KEYS = frozenset(str(key) for key in MetadataKey)
"""The metadata keys emote writes itself."""


def user_metadata_props(model: Any) -> list[Any]:
    """The metadata props of an ONNX model that emote did not write itself, in file order.

    These are the entries given to ``OnnxExporter.add_metadata`` and ``export(metadata)``.

    Args:
        model: An ``onnx.ModelProto`` (``onnx.load(path)``).

    Returns:
        Its ``metadata_props`` entries (each with ``.key`` and ``.value``) whose keys are not
        :class:`MetadataKey` values.
    """
    return [prop for prop in model.metadata_props if prop.key not in EMOTE_METADATA_KEYS]


def metadata_props(owner: str, metadata: Mapping[Any, Any]) -> dict[str, str]:
    """User metadata as props: string keys kept, values as given when strings, else as JSON.

    Args:
        owner: Names the caller in errors.
        metadata: Keys and values to write.

    Raises:
        TypeError: If a key is not a string.
        ConfigurationError: If a key is one emote writes itself (:class:`MetadataKey`).
    """
    props = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(
                f"{owner}: ONNX metadata keys must be strings; got {key!r} "
                f"({type(key).__name__}) — pass str(key)"
            )
        if key in EMOTE_METADATA_KEYS:
            raise ConfigurationError(
                f"{owner}: metadata key '{key}' is written by emote itself; choose another key"
            )
        props[key] = value if isinstance(value, str) else json.dumps(value)
    return props


@dataclass(frozen=True)
class PolicyMetadata:
    """The metadata of one export, as :meth:`to_props` writes and :meth:`from_props` reads it.

    Attributes:
        algorithm: The registered name of the algorithm that trained the policy.
        observation_space: The observation entries the policy reads, by key.
        action_space: The actions as the policy produces them.
        action_bounds: The environment's action bounds (see :attr:`MetadataKey.ACTION_BOUNDS`).
        input_names: The graph's inputs, in order.
        output_names: The graph's outputs, in order.
        recipe: The recipe's name ("" when exported outside a recipe).
        recipe_toml: The resolved recipe ("" when none).
        training_step: The update the weights come from.
        source_checkpoint: The checkpoint file exported ("" for exports made during training).
        source_checkpoint_sha256: Its sha256 ("" when none).
        opset: The default-domain opset of the file.
        emote_version: The emote that wrote the file.
        action_mask_key: The observation fed to the ``action_masks`` input ("" when none).
        extra: Further props (``OnnxExporter.add_metadata``), written as given.
        profile: The tensor contract of the file.
        profile_observations: ``ml-agents`` profile: the observation key behind each ``obs_i``.
    """

    algorithm: str
    observation_space: DictSpace
    action_space: BoxSpace
    action_bounds: dict[str, Any]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    recipe: str = ""
    recipe_toml: str = ""
    training_step: int = 0
    source_checkpoint: str = ""
    source_checkpoint_sha256: str = ""
    opset: int = 0
    emote_version: str = __version__
    action_mask_key: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    profile: ExportProfile = ExportProfile.EMOTE
    profile_observations: tuple[str, ...] = ()

    @property
    def observation_keys(self) -> tuple[str, ...]:
        """The observation inputs (every input but ``epsilon`` and ``action_masks``), in graph
        order; for the ``ml-agents`` profile, the keys behind ``obs_0, obs_1, ...``."""
        if self.profile is ExportProfile.ML_AGENTS:
            return self.profile_observations
        return tuple(n for n in self.input_names if n not in (EPSILON_INPUT, ACTION_MASKS_INPUT))

    @property
    def masked(self) -> bool:
        """Whether the graph takes ``action_masks``."""
        return ACTION_MASKS_INPUT in self.input_names

    @property
    def stochastic(self) -> bool:
        """Whether the graph takes ``epsilon`` noise."""
        return EPSILON_INPUT in self.input_names

    @property
    def discrete(self) -> bool:
        """Whether actions are discrete indices."""
        return isinstance(self.action_space, DiscreteSpace)

    @property
    def format_version(self) -> OnnxPolicyVersion:
        """The oldest format version that describes this export: V2 with ``action_masks``, V3
        for the ``ml-agents`` profile."""
        if self.profile is ExportProfile.ML_AGENTS:
            return OnnxPolicyVersion.V3
        return OnnxPolicyVersion.V2 if self.masked else OnnxPolicyVersion.V1

    def to_props(self) -> dict[str, str]:
        """The metadata props to write: every value a string, structured ones as JSON."""
        props = {
            MetadataKey.FORMAT: FORMAT_NAME,
            MetadataKey.FORMAT_VERSION: str(int(self.format_version)),
            MetadataKey.EMOTE_VERSION: self.emote_version,
            MetadataKey.ALGORITHM: str(self.algorithm),
            MetadataKey.RECIPE: self.recipe,
            MetadataKey.RECIPE_TOML: self.recipe_toml,
            MetadataKey.OBSERVATION_SPACE: json.dumps(self.observation_space.to_json()),
            MetadataKey.ACTION_SPACE: json.dumps(self.action_space.to_json()),
            MetadataKey.ACTION_BOUNDS: json.dumps(self.action_bounds),
            MetadataKey.INPUT_NAMES: json.dumps(list(self.input_names)),
            MetadataKey.OUTPUT_NAMES: json.dumps(list(self.output_names)),
            MetadataKey.TRAINING_STEP: str(int(self.training_step)),
            MetadataKey.SOURCE_CHECKPOINT: self.source_checkpoint,
            MetadataKey.SOURCE_CHECKPOINT_SHA256: self.source_checkpoint_sha256,
            MetadataKey.OPSET: str(int(self.opset)),
        }
        if self.masked:
            props[MetadataKey.ACTION_MASK_KEY] = self.action_mask_key
        if self.profile is ExportProfile.ML_AGENTS:
            props[MetadataKey.PROFILE] = str(self.profile)
            props[MetadataKey.OBSERVATION_KEYS] = json.dumps(list(self.profile_observations))
        return {**self.extra, **{str(key): value for key, value in props.items()}}

    @classmethod
    def from_props(cls, props: Mapping[str, str], *, source: str) -> PolicyMetadata:
        """Reads the metadata of an export.

        Args:
            props: The file's metadata props.
            source: Names the file in error messages.

        Raises:
            FormatError: If the file is not an emote policy export, is from a newer emote, or a
                prop is malformed.
        """
        if props.get(MetadataKey.FORMAT) != FORMAT_NAME:
            raise FormatError(
                f"'{source}' is not an emote policy export (its metadata has no "
                f"format={FORMAT_NAME!r}); export policies with `emote export onnx`"
            )
        try:
            version = int(props[MetadataKey.FORMAT_VERSION])
            if version > OnnxPolicyVersion.LATEST:
                raise FormatError(
                    f"'{source}' has format_version {version}; this emote reads up to "
                    f"{int(OnnxPolicyVersion.LATEST)} — upgrade emote"
                )
            observation_space = space_from_json(json.loads(props[MetadataKey.OBSERVATION_SPACE]))
            action_space = space_from_json(json.loads(props[MetadataKey.ACTION_SPACE]))
            if not isinstance(observation_space, DictSpace) or isinstance(action_space, DictSpace):
                raise FormatError(f"'{source}' has malformed observation or action spaces")
            input_names = tuple(json.loads(props[MetadataKey.INPUT_NAMES]))
            mask_key = props.get(MetadataKey.ACTION_MASK_KEY, "")
            profile = ExportProfile(props.get(MetadataKey.PROFILE, ExportProfile.EMOTE))
            observations = (
                tuple(json.loads(props[MetadataKey.OBSERVATION_KEYS]))
                if profile is ExportProfile.ML_AGENTS
                else ()
            )
            if any(key not in observation_space.spaces for key in observations):
                raise FormatError(
                    f"'{source}' names observation keys {list(observations)} that its "
                    "observation space does not hold; re-export it with `emote export onnx`"
                )
            if (
                ACTION_MASKS_INPUT in input_names
                and mask_key not in observation_space.spaces
                and profile is ExportProfile.EMOTE  # ml-agents files always take a mask
            ):
                raise FormatError(
                    f"'{source}' takes '{ACTION_MASKS_INPUT}' but its metadata names no "
                    f"observation that feeds it ({MetadataKey.ACTION_MASK_KEY}={mask_key!r}); "
                    "re-export it with `emote export onnx`"
                )
            return cls(
                algorithm=props[MetadataKey.ALGORITHM],
                observation_space=observation_space,
                action_space=action_space,
                action_bounds=json.loads(props[MetadataKey.ACTION_BOUNDS]),
                input_names=input_names,
                output_names=tuple(json.loads(props[MetadataKey.OUTPUT_NAMES])),
                recipe=props.get(MetadataKey.RECIPE, ""),
                recipe_toml=props.get(MetadataKey.RECIPE_TOML, ""),
                training_step=int(props.get(MetadataKey.TRAINING_STEP, "0")),
                source_checkpoint=props.get(MetadataKey.SOURCE_CHECKPOINT, ""),
                source_checkpoint_sha256=props.get(MetadataKey.SOURCE_CHECKPOINT_SHA256, ""),
                opset=int(props.get(MetadataKey.OPSET, "0")),
                emote_version=props.get(MetadataKey.EMOTE_VERSION, ""),
                action_mask_key=mask_key,
                extra={k: v for k, v in props.items() if k not in EMOTE_METADATA_KEYS},
                profile=profile,
                profile_observations=observations,
            )
        except (KeyError, ValueError, TypeError, ConfigurationError) as error:
            raise FormatError(
                f"'{source}' has malformed emote policy metadata: {error!r}; re-export it with "
                "`emote export onnx`"
            ) from error


__all__ = [
    "ACTIONS_OUTPUT",
    "ACTION_MASKS_INPUT",
    "ACTION_RESCALE",
    "BATCH_AXIS",
    "EMOTE_METADATA_KEYS",
    "EPSILON_INPUT",
    "FORMAT_NAME",
    "MAX_POLICY_BYTES",
    "ML_AGENTS_MODEL_VERSION",
    "ML_AGENTS_PIXEL_SCALE",
    "Q_VALUES_OUTPUT",
    "ExportProfile",
    "MetadataKey",
    "MlAgentsObservation",
    "MlAgentsTensor",
    "OnnxPolicyVersion",
    "PolicyMetadata",
    "metadata_props",
    "ml_agents_observation",
    "user_metadata_props",
]
