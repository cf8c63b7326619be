"""Stable-Baselines3 replay buffers, as ``model.save_replay_buffer(path)`` pickles them.

The pickle is read by the restricted unpickler (SB3 need not be installed; nothing runs). Each
env's rows of the ring, oldest first, are split into episodes at ``dones``: TERMINAL, or
INTERRUPTED where ``timeouts`` is set; the rows after the last done form an INTERRUPTED episode.
Box actions stay as SB3 stored them, scaled to ``[-1, 1]`` (``metadata["env_action_low"/
"env_action_high"]`` hold the env's bounds). ``metadata`` also says when a wrapped ring's first
episode may be partial and, with ``optimize_memory_usage``, that final observations are lost.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError, FormatError
from emote_core.integrations.streams import (
    ACTIONS_KEY,
    OBS_KEY,
    REWARDS_KEY,
    EnvStream,
    end_codes,
    json_number,
    peer_table,
    read_file_bytes,
    rewards_column,
    rows_flat,
)
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import safe_loads, upstream_name
from emote_core.stores.stored import StoredTable

log = logging.getLogger(__name__)

SB3_FORMAT = "sb3-replay-buffer"
"""The format name of Stable-Baselines3 replay buffer pickles."""

SB3_BUFFER_CLASSES = (
    "stable_baselines3.common.buffers.ReplayBuffer",
    "stable_baselines3.common.buffers.DictReplayBuffer",
    "stable_baselines3.common.buffers.NStepReplayBuffer",
)
"""The buffer classes this reader understands."""

_MISSING = object()


def _class_name(value: Any) -> str:
    name = upstream_name(value)
    if name is not None:
        return name
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"  # a real object (--trust-pickle)


def _get(buffer: Any, name: str, source: str) -> Any:
    value = getattr(buffer, name, _MISSING)
    if value is _MISSING:
        raise FormatError(
            f"{source} has no '{name}' attribute; it is not a replay buffer from "
            "Stable-Baselines3 2.x's save_replay_buffer"
        )
    return value


def _array(value: Any, name: str, rows: int, envs: int, source: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        raise FormatError(
            f"{source}: '{name}' is a {type(value).__name__} "
            f"{getattr(value, 'dtype', '')}; expected a numeric numpy array"
        )
    if value.shape[:2] != (rows, envs):
        raise FormatError(
            f"{source}: '{name}' has shape {value.shape}; its leading dimensions must be "
            f"(buffer_size, n_envs) = {(rows, envs)}"
        )
    return value


def _observations(value: Any, name: str, dict_buffer: bool, shape: tuple[int, int], source: str):
    if not dict_buffer:
        return {OBS_KEY: _array(value, name, *shape, source)}
    if not isinstance(value, dict) or not value:
        raise FormatError(
            f"{source}: '{name}' of a DictReplayBuffer is a {type(value).__name__}; expected a "
            "dict of arrays"
        )
    clash = sorted({ACTIONS_KEY, REWARDS_KEY} & set(value))
    if clash:
        raise FormatError(
            f"{source}: observation keys {clash} clash with the columns 'actions'/'rewards'; "
            "rename the observation entries before saving the buffer"
        )
    return {str(k): _array(a, f"{name}[{k!r}]", *shape, source) for k, a in value.items()}


def _integer(value: Any, name: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise FormatError(f"{source}: '{name}' is {value!r}; expected an integer")
    return int(value)


def _row_order(pos: int, full: bool, rows: int, drop_oldest: bool) -> np.ndarray:
    if not full:
        return np.arange(pos)
    order = np.concatenate([np.arange(pos, rows), np.arange(pos)])
    return order[1:] if drop_oldest else order


def read_sb3_replay_buffer(
    path: str | os.PathLike[str], *, trust_pickle: bool = False
) -> StoredTable:
    """Reads a Stable-Baselines3 ``save_replay_buffer`` pickle as episodes.

    Args:
        path: The ``.pkl`` file.
        trust_pickle: Unpickle without restrictions (runs the file's code and needs SB3
            installed): only for files whose origin the user vouches for.

    Returns:
        Columns ``obs`` (or one column per key of a dict observation; ``N + 1`` rows per
        episode), ``actions`` and ``rewards`` (float32, ``(1,)``); episodes ordered by the step
        they end at; ``spaces`` from the buffer's spaces; ``metadata`` with ``n_envs``,
        ``buffer_size``, ``pos``, ``full``, ``episode_envs`` and the caveats in the module doc.

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist; nothing ran.
        FormatError: The file is missing, empty, damaged or not an SB3 replay buffer.
    """
    source = f"Stable-Baselines3 replay buffer '{path}'"
    _, data = read_file_bytes(path, "Stable-Baselines3 replay buffer")
    if trust_pickle:
        log.warning("unpickling %s without restrictions (--trust-pickle): it may run code", path)
    buffer = safe_loads(data, trust=trust_pickle, budget=AllocationBudget(source, len(data)))
    kind = _class_name(buffer)
    if kind not in SB3_BUFFER_CLASSES:
        raise FormatError(
            f"{source} holds a {kind}; expected one of {list(SB3_BUFFER_CLASSES)} (rollout and "
            "HER buffers are not supported)"
        )
    dict_buffer = kind.endswith("DictReplayBuffer")
    rows = _integer(_get(buffer, "buffer_size", source), "buffer_size", source)
    envs = _integer(_get(buffer, "n_envs", source), "n_envs", source)
    pos = _integer(_get(buffer, "pos", source), "pos", source)
    full = bool(_get(buffer, "full", source))
    if rows < 1 or envs < 1 or not 0 <= pos <= rows:
        raise FormatError(
            f"{source}: buffer_size={rows}, n_envs={envs}, pos={pos} are inconsistent; expected "
            "buffer_size >= 1, n_envs >= 1 and 0 <= pos <= buffer_size"
        )
    optimized = bool(getattr(buffer, "optimize_memory_usage", False))
    shape = (rows, envs)
    observations = _observations(
        _get(buffer, "observations", source), "observations", dict_buffer, shape, source
    )
    if optimized:
        next_observations = {k: np.roll(v, -1, axis=0) for k, v in observations.items()}
    else:
        next_observations = _observations(
            _get(buffer, "next_observations", source),
            "next_observations",
            dict_buffer,
            shape,
            source,
        )
    actions = _array(_get(buffer, "actions", source), "actions", *shape, source)
    rewards = _array(_get(buffer, "rewards", source), "rewards", *shape, source)
    dones = _array(_get(buffer, "dones", source), "dones", *shape, source)
    timeouts = getattr(buffer, "timeouts", None)
    timeouts = np.zeros(shape) if timeouts is None else _array(timeouts, "timeouts", *shape, source)
    handle_timeouts = bool(getattr(buffer, "handle_timeout_termination", False))
    if not handle_timeouts:
        timeouts = np.zeros(shape)  # SB3 recorded no time limits: it treats every done as terminal
    order = _row_order(pos, full, rows, drop_oldest=optimized)
    streams = []
    for env in range(envs):
        done = dones[order, env] > 0
        interrupted = done & (timeouts[order, env] > 0)
        streams.append(
            EnvStream(
                observations={k: v[order, env] for k, v in observations.items()},
                next_observations={k: v[order, env] for k, v in next_observations.items()},
                steps={
                    ACTIONS_KEY: rows_flat(actions[order, env]),
                    REWARDS_KEY: rewards_column(rewards[order, env], len(order), source=source),
                },
                ends=end_codes(terminal=done & ~interrupted, interrupted=interrupted),
                env=env,
            )
        )
    lost_finals = optimized and bool((dones[order] > 0).any())
    if lost_finals:
        log.warning(
            "%s was saved with optimize_memory_usage: SB3 kept no final observation for "
            "episodes that ended in a done; the next episode's first observation stands in",
            source,
        )
    spaces, action_info = _spaces(buffer, list(observations), actions.dtype, source)
    metadata = {
        "n_envs": envs,
        "buffer_size": rows,
        "pos": pos,
        "full": full,
        "optimize_memory_usage": optimized,
        "handle_timeout_termination": handle_timeouts,
        "first_episode_may_be_partial": full,
        "final_observations_recorded": not lost_finals,
        **action_info,
    }
    return peer_table(
        source=source, format=SB3_FORMAT, streams=streams, spaces=spaces, metadata=metadata
    )


def _box(space: Any, key: str, dtype: np.dtype[Any] | None = None) -> BoxSpace:
    """An emote box (or discrete) space from a gymnasium space, real or stand-in."""
    kind = _class_name(space).rsplit(".", 1)[-1]
    if kind == "Discrete":
        start = json_number(getattr(space, "start", 0))
        if start != 0:
            raise ConfigurationError(f"space '{key}' is Discrete with start {start}")
        return DiscreteSpace(n=int(space.n), dtype=np.dtype(dtype or space.dtype))
    if kind != "Box":
        raise ConfigurationError(f"space '{key}' is a {kind}")
    shape = getattr(space, "_shape", None) or getattr(space, "shape", None)
    low = np.asarray(space.low, dtype=np.float64)
    high = np.asarray(space.high, dtype=np.float64)
    return BoxSpace(
        dtype=np.dtype(space.dtype),
        shape=tuple(shape),
        low=None if np.all(np.isneginf(low)) else low,
        high=None if np.all(np.isposinf(high)) else high,
    )


def _spaces(
    buffer: Any, keys: list[str], action_dtype: np.dtype[Any], source: str
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The MDP spaces as JSON, and what to record about the actions' scaling."""
    try:
        observation_space = buffer.observation_space
        if _class_name(observation_space).endswith(".Dict"):
            members = dict(observation_space.spaces)
            state = DictSpace({key: _box(members[key], key) for key in keys})
        else:
            state = DictSpace({OBS_KEY: _box(observation_space, OBS_KEY)})
        action_space = _box(buffer.action_space, ACTIONS_KEY, action_dtype)
        info: dict[str, Any] = {"actions_scaled_to_unit_box": False}
        if not isinstance(action_space, DiscreteSpace):
            # SB3's off-policy algorithms store Box actions rescaled to [-1, 1].
            info = {
                "actions_scaled_to_unit_box": True,
                "env_action_low": [json_number(v) for v in np.ravel(buffer.action_space.low)],
                "env_action_high": [json_number(v) for v in np.ravel(buffer.action_space.high)],
            }
            action_space = BoxSpace(action_dtype, action_space.shape, low=-1.0, high=1.0)
        spaces = MDPSpace(BoxSpace(np.float32, (1,)), action_space, state)
        return spaces.to_json(), info
    except (AttributeError, KeyError, TypeError, ValueError, ConfigurationError) as error:
        log.warning("%s: its spaces are not recorded (%s)", source, error)
        return None, {}


__all__ = ["SB3_BUFFER_CLASSES", "SB3_FORMAT", "read_sb3_replay_buffer"]
