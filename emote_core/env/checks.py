"""Checks of an environment before emote trains on it (``emote env check``).

:func:`check_environment` makes the environment, runs gymnasium's own checker (PettingZoo's
``parallel_api_test`` for a ``ParallelEnv``) and emote's checks: spaces it supports, the step API,
finite observations inside the declared space, reproducible seeding, episodes that end, the scale
of observations and the time a step takes. Each check is a :class:`CheckResult` with the fix for a
failure; nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import time
import traceback
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from emote_core.errors import ConfigurationError, EmoteError

__all__ = [
    "DEFAULT_CHECK_STEPS",
    "OBSERVATION_SCALE_LIMIT",
    "SLOW_STEP_SECONDS",
    "CheckResult",
    "CheckStatus",
    "EnvCheckReport",
    "check_environment",
]

DEFAULT_CHECK_STEPS = 2_000
"""Random-action steps played to see episodes end, observations' scale and step time."""
OBSERVATION_SCALE_LIMIT = 10.0
"""A dimension whose ``|mean|`` or standard deviation is above this asks for normalisation."""
SLOW_STEP_SECONDS = 0.01
"""Mean seconds per step above which the step time is a warning."""
SEEDING_STEPS = 10
"""Steps replayed with the same seed and actions to compare rewards and observations."""

_NORMALIZE_FIX = "set [env] normalize_observations = true"
_HANDLED_BY_EMOTE = (
    "we recommend using a symmetric and normalized space",  # emote rescales Box actions
    "observation space minimum value is -infinity",  # emote needs no observation bounds
    "observation space maximum value is infinity",
)
"""gymnasium checker warnings about what emote already takes care of; left out of the report."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CheckStatus(StrEnum):
    """The outcome of one check."""

    PASS = "pass"
    """The environment does what emote needs."""
    WARN = "warn"
    """It works, but training may suffer; the fix says what to change."""
    FAIL = "fail"
    """emote cannot train on it as it is; the fix says what to change."""
    SKIP = "skip"
    """Not run because an earlier check failed."""


@dataclass(frozen=True)
class CheckResult:
    """One line of the checklist: a check's name, outcome, what was seen and the fix."""

    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"name", "status", "detail", "fix"}``."""
        return {
            "name": self.name,
            "status": str(self.status),
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class EnvCheckReport:
    """Every check of one environment, in the order they ran."""

    env: str
    checks: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """True when no check failed (warnings do not fail)."""
        return all(check.status is not CheckStatus.FAIL for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """``{"env", "checks": [...], "passed"}``."""
        return {
            "env": self.env,
            "checks": [check.to_json() for check in self.checks],
            "passed": self.passed,
        }


def check_environment(
    make: Callable[[], Any],
    *,
    env: str,
    steps: int = DEFAULT_CHECK_STEPS,
    seed: int = 0,
    normalize_observations: bool = False,
    slow_step_seconds: float = SLOW_STEP_SECONDS,
) -> EnvCheckReport:
    """Makes an environment and checks it the way emote will use it.

    Args:
        make: Returns a new environment each call (a gymnasium ``Env`` or a PettingZoo
            ``ParallelEnv``); called up to twice. Its errors become the ``made`` check's failure.
        env: How the environment was named, for the report.
        steps: Random-action steps played for the episode, scale and step-time checks.
        seed: Seeds resets and the sampled actions.
        normalize_observations: The recipe already normalises observations (no scale warning).
        slow_step_seconds: Mean seconds per step above which step time is a warning.

    Returns:
        The report; :attr:`EnvCheckReport.passed` is False when a check failed.

    Raises:
        ConfigurationError: If ``steps`` is not positive.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigurationError(f"steps must be a positive integer; got {steps!r}")
    made, instance = _made(lambda: _unchecked(make()))
    if instance is None:
        return EnvCheckReport(env, (made,))
    api: type[_Api] = _ParallelApi if _is_parallel_env(instance) else _GymnasiumApi
    try:
        checks = _checks(
            api,
            make,
            instance,
            steps=steps,
            seed=seed,
            normalize_observations=normalize_observations,
            slow_step_seconds=slow_step_seconds,
        )
    finally:
        _close(instance)
    return EnvCheckReport(env, (made, *checks))


def _checks(
    api_type: type[_Api],
    make: Callable[[], Any],
    instance: Any,
    *,
    steps: int,
    seed: int,
    normalize_observations: bool,
    slow_step_seconds: float,
) -> list[CheckResult]:
    """The API's own checker on a fresh instance, then emote's checks on ``instance``."""
    checks = [api_type.checker(make, steps)]
    try:
        api = api_type(instance)
    except EmoteError as error:  # only a ParallelEnv's agents can be ungroupable
        checks.append(
            CheckResult(
                "spaces",
                CheckStatus.FAIL,
                _describe(error),
                fix="list every agent in possible_agents, with observation_space(agent) and "
                "action_space(agent)",
            )
        )
        return checks
    checks.append(_spaces_check(api.groups))
    rollout = _Rollout.play(api, steps=steps, seed=seed)
    return checks + _rollout_checks(rollout, seed, normalize_observations, slow_step_seconds)


def _describe(error: BaseException) -> str:
    """An exception as one line: an emote error's message, others with their type."""
    if isinstance(error, EmoteError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(text.split())


def _close(instance: Any) -> None:
    # A failing close says nothing about training; the checks are done.
    with contextlib.suppress(Exception):
        instance.close()


@contextlib.contextmanager
def _quiet_warnings(into: list[str] | None = None) -> Iterator[None]:
    """Warnings raised inside are collected (ANSI colours removed) instead of printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    if into is not None:
        for warning in caught:
            text = " ".join(_ANSI.sub("", str(warning.message)).split()).removeprefix("WARN: ")
            if text not in into:
                into.append(text)


def _made(make: Callable[[], Any]) -> tuple[CheckResult, Any]:
    try:
        with _quiet_warnings():
            instance = make()
    except Exception as error:  # the user's import or constructor: report it, never crash
        return (
            CheckResult(
                "made",
                CheckStatus.FAIL,
                _describe(error),
                fix="make the module importable and its env constructible with the recipe's "
                "[env] kwargs",
            ),
            None,
        )
    if not (_is_parallel_env(instance) or _is_gymnasium_env(instance)):
        return (
            CheckResult(
                "made",
                CheckStatus.FAIL,
                f"got a {type(instance).__name__}, which is neither a gymnasium Env nor a "
                "PettingZoo ParallelEnv",
                fix="return a gymnasium.Env (or a pettingzoo.ParallelEnv) from the entry point",
            ),
            None,
        )
    kind = "PettingZoo ParallelEnv" if _is_parallel_env(instance) else "gymnasium Env"
    name = type(getattr(instance, "unwrapped", instance)).__name__
    return CheckResult("made", CheckStatus.PASS, f"{name} ({kind})"), instance


def _unchecked(env: Any) -> Any:
    """``env`` without emote's :class:`~emote_core.env.making.CheckedEnv` layer, which raises at
    the first wrong step result or NaN observation: the checks look at those themselves, to
    report them under the check they fail."""
    import gymnasium

    from emote_core.env.making import CheckedEnv

    parent, current = None, env
    while isinstance(current, gymnasium.Wrapper):
        if isinstance(current, CheckedEnv):
            if parent is None:
                return current.env
            parent.env = current.env
            return env
        parent, current = current, current.env
    return env


def _is_gymnasium_env(instance: Any) -> bool:
    import gymnasium

    return isinstance(instance, gymnasium.Env)


def _is_parallel_env(instance: Any) -> bool:
    from emote_core.env.making import is_parallel_env

    return is_parallel_env(instance)


# --- the two APIs -------------------------------------------------------------------------------


class _Malformed(EmoteError):
    """A reset or step result not of the API's form; the message says what is wrong."""


@dataclass(frozen=True)
class _Transition:
    """What one agent got back from a step."""

    observation: Any
    reward: Any
    terminated: Any
    truncated: Any


@dataclass(frozen=True)
class _Group:
    """Agents of identical spaces; ``name`` is ``None`` for a gymnasium env's one agent."""

    name: str | None
    size: int
    observation_space: Any
    action_space: Any


class _Api(ABC):
    """How the checks drive one kind of env: reset, sample joint actions, step, and read back each
    agent's transition. Agents are keys of dicts; a gymnasium env is the one agent ``None``."""

    returned: ClassVar[str]
    """What a sound step returns, for the step check's detail."""
    fix_returned: ClassVar[str]
    fix_seeding: ClassVar[str]
    actions_text: ClassVar[str]
    """What one step's actions are called in the seeding check's detail."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.groups: list[_Group] = []

    @staticmethod
    @abstractmethod
    def checker(make: Callable[[], Any], steps: int) -> CheckResult:
        """The API's own test, on a fresh instance from ``make``."""

    @property
    @abstractmethod
    def agents(self) -> list[Any]:
        """The agents that act now; none once the episode is over."""

    @abstractmethod
    def seed_actions(self, seed: int) -> None:
        """Seeds the action spaces that :meth:`sample` draws from."""

    @abstractmethod
    def observation_space(self, agent: Any) -> Any: ...

    @abstractmethod
    def action_space(self, agent: Any) -> Any: ...

    @abstractmethod
    def group(self, agent: Any) -> str | None:
        """The name of ``agent``'s group in statistics' keys; ``None`` for an unknown agent."""

    @abstractmethod
    def where(self, place: str, agent: Any) -> str:
        """``place`` ("reset", "step 3") naming ``agent`` where there are several."""

    @abstractmethod
    def reset(self, seed: int | None) -> dict[Any, Any]:
        """Resets the env: each agent's observation. Raises _Malformed for a wrong result."""

    @abstractmethod
    def step(self, actions: dict[Any, Any]) -> Any:
        """Steps the env with each acting agent's action; what the env returned."""

    @abstractmethod
    def transitions(self, result: Any) -> dict[Any, _Transition]:
        """Each agent's part of a :meth:`step` result. Raises _Malformed for a wrong one."""

    def sample(self, observations: Mapping[Any, Any]) -> dict[Any, Any]:
        """A random legal action for each acting agent."""
        return {
            agent: _sample(self.action_space(agent), observations.get(agent))
            for agent in self.agents
        }

    def replayed(self, actions: Mapping[Any, Any]) -> dict[Any, Any]:
        """``actions`` of a replayed step, for the agents that act now."""
        return {agent: actions[agent] for agent in self.agents if agent in actions}


class _GymnasiumApi(_Api):
    """A gymnasium ``Env``: one agent, ``None``, whose episode ends when it terminates."""

    returned = "(observation, reward, terminated, truncated, info)"
    fix_returned = (
        "return (observation, info) from reset and (observation, reward, terminated, truncated, "
        "info) from step, with a float reward and bool flags"
    )
    fix_seeding = (
        "pass reset's seed to super().reset(seed=seed) and draw all randomness from self.np_random"
    )
    actions_text = "actions"

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.groups = [_Group(None, 1, env.observation_space, env.action_space)]
        self._ended = False

    @staticmethod
    def checker(make: Callable[[], Any], steps: int) -> CheckResult:
        """gymnasium's ``check_env`` on an unwrapped instance (its warnings: a warning)."""
        from gymnasium.utils.env_checker import check_env

        return _run_checker(
            "gymnasium_checker",
            lambda: _unchecked(make()),
            lambda env: check_env(env.unwrapped, skip_render_check=True, skip_close_check=True),
            fix="follow gymnasium's Env API (gymnasium.farama.org/introduction/create_custom_env)",
            follow="follow each of gymnasium's warnings",
            found_nothing="gymnasium's check_env found nothing",
            ignored=_HANDLED_BY_EMOTE,
        )

    @property
    def agents(self) -> list[Any]:
        return [] if self._ended else [None]

    def seed_actions(self, seed: int) -> None:
        self.env.action_space.seed(seed)

    def observation_space(self, agent: Any) -> Any:
        return self.env.observation_space

    def action_space(self, agent: Any) -> Any:
        return self.env.action_space

    def group(self, agent: Any) -> str | None:
        return ""

    def where(self, place: str, agent: Any) -> str:
        return place

    def reset(self, seed: int | None) -> dict[Any, Any]:
        result = self.env.reset(seed=seed)
        if not isinstance(result, tuple) or len(result) != 2:
            raise _Malformed("reset must return (observation, info)")
        if not isinstance(result[1], dict):
            raise _Malformed(f"reset's info is a {type(result[1]).__name__}, not a dict")
        self._ended = False
        return {None: result[0]}

    def step(self, actions: dict[Any, Any]) -> Any:
        return self.env.step(actions[None])

    def transitions(self, result: Any) -> dict[Any, _Transition]:
        if not isinstance(result, tuple):
            raise _Malformed(f"step returned a {type(result).__name__}, not a tuple of 5")
        if len(result) != 5:
            raise _Malformed(f"step returned {len(result)} values; gymnasium's API returns 5")
        observation, reward, terminated, truncated, info = result
        _check_reward(reward, "reward")
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(flag, _FLAG_TYPES):
                raise _Malformed(f"{name} is a {type(flag).__name__}, not a bool")
        if not isinstance(info, dict):
            raise _Malformed(f"info is a {type(info).__name__}, not a dict")
        self._ended = bool(terminated or truncated)
        return {None: _Transition(observation, reward, terminated, truncated)}


class _ParallelApi(_Api):
    """A PettingZoo ``ParallelEnv``: agents by name, grouped by identical spaces; an episode ends
    when no agent is left."""

    returned = "dicts of observations, rewards, terminations, truncations, infos"
    fix_returned = (
        "return (observations, infos) from reset and (observations, rewards, terminations, "
        "truncations, infos) from step, dicts keyed by agent"
    )
    fix_seeding = "seed every random draw of reset and step from reset's seed"
    actions_text = "joint actions"

    def __init__(self, env: Any) -> None:
        """Raises: ConfigurationError: If the env lists no ``possible_agents``."""
        from emote_core.env.multi_agent import agent_groups

        super().__init__(env)
        groups = agent_groups(env)
        self.groups = [
            _Group(g.name, len(g.agents), g.observation_space, g.action_space) for g in groups
        ]
        self._group_of = {agent: group.name for group in groups for agent in group.agents}

    @staticmethod
    def checker(make: Callable[[], Any], steps: int) -> CheckResult:
        """PettingZoo's ``parallel_api_test`` (its asserts: a failure)."""
        from pettingzoo.test import parallel_api_test

        # The test prints its verdict; stdout belongs to the caller (``--json``).
        with contextlib.redirect_stdout(io.StringIO()):
            return _run_checker(
                "pettingzoo_api",
                make,
                lambda env: parallel_api_test(env, num_cycles=min(steps, 1_000)),
                fix="follow PettingZoo's Parallel API (pettingzoo.farama.org/api/parallel)",
                follow="follow each of PettingZoo's warnings",
                found_nothing="parallel_api_test found nothing",
                describe=_assertion_text,
            )

    @property
    def agents(self) -> list[Any]:
        return list(self.env.agents)

    def seed_actions(self, seed: int) -> None:
        for offset, agent in enumerate(self.env.possible_agents):
            self.env.action_space(agent).seed(seed + offset)

    def observation_space(self, agent: Any) -> Any:
        return self.env.observation_space(agent)

    def action_space(self, agent: Any) -> Any:
        return self.env.action_space(agent)

    def group(self, agent: Any) -> str | None:
        return self._group_of.get(agent)

    def where(self, place: str, agent: Any) -> str:
        return f"{place}, agent '{agent}'"

    def reset(self, seed: int | None) -> dict[Any, Any]:
        result = self.env.reset(seed=seed)
        if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], dict):
            raise _Malformed("reset must return (observations, infos), two dicts keyed by agent")
        return result[0]

    def step(self, actions: dict[Any, Any]) -> Any:
        return self.env.step(actions)

    def transitions(self, result: Any) -> dict[Any, _Transition]:
        if not isinstance(result, tuple):
            raise _Malformed(f"step returned a {type(result).__name__}, not a tuple of 5 dicts")
        if len(result) != 5:
            raise _Malformed(
                f"step returned {len(result)} values; PettingZoo's Parallel API returns 5 dicts"
            )
        names = ("observations", "rewards", "terminations", "truncations", "infos")
        for name, value in zip(names, result, strict=True):
            if not isinstance(value, dict):
                raise _Malformed(f"{name} is a {type(value).__name__}, not a dict keyed by agent")
        observations, rewards, terminations, truncations, _ = result
        for agent, reward in rewards.items():
            _check_reward(reward, f"agent '{agent}''s reward")
        return {
            agent: _Transition(
                observation, rewards.get(agent), terminations.get(agent), truncations.get(agent)
            )
            for agent, observation in observations.items()
        }


_REWARD_TYPES = (int, float, np.integer, np.floating)
_FLAG_TYPES = (bool, np.bool_)


def _check_reward(reward: Any, name: str) -> None:
    """Raises _Malformed unless ``reward`` is a number (a one-element array counts)."""
    if isinstance(reward, np.ndarray) and reward.size == 1:
        reward = reward.item()
    if isinstance(reward, bool) or not isinstance(reward, _REWARD_TYPES):
        raise _Malformed(f"{name} is a {type(reward).__name__}, not a number")


def _run_checker(
    name: str,
    make: Callable[[], Any],
    test: Callable[[Any], None],
    *,
    fix: str,
    follow: str,
    found_nothing: str,
    describe: Callable[[BaseException], str] = _describe,
    ignored: tuple[str, ...] = (),
) -> CheckResult:
    """``test`` on a fresh instance from ``make``: its exception (told by ``describe``) is the
    failure; its warnings, but the ``ignored`` ones, a warning."""
    messages: list[str] = []
    instance = None
    try:
        with _quiet_warnings(messages):
            instance = make()
            test(instance)
    except Exception as error:  # what the checker found: its exception is the failure
        return CheckResult(name, CheckStatus.FAIL, describe(error), fix=fix)
    finally:
        if instance is not None:
            _close(instance)
    messages = [m for m in messages if not any(text in m for text in ignored)]
    if messages:
        return CheckResult(
            name,
            CheckStatus.WARN,
            f"{len(messages)} warning{'s' if len(messages) > 1 else ''}: {'; '.join(messages)}",
            fix=follow,
        )
    return CheckResult(name, CheckStatus.PASS, found_nothing)


def _assertion_text(error: BaseException) -> str:
    """An assert's message's first line, then the assert's line; other errors as usual."""
    if not isinstance(error, AssertionError):
        return _describe(error)
    detail = (str(error).strip().splitlines() or ["AssertionError"])[0]
    frames = traceback.extract_tb(error.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return f"{detail} ({line})" if line else detail


# --- emote's checks, one of each for both APIs --------------------------------------------------


def _rollout_checks(
    rollout: _Rollout, seed: int, normalize_observations: bool, slow_step_seconds: float
) -> list[CheckResult]:
    """The checks a random rollout answers, with seeding between; those a failure leaves
    without evidence are skipped."""
    checks = [rollout.step_check(), rollout.observations_check()]
    if rollout.step_problem is not None:
        skipped = "not run: the step check failed"
        checks.extend(
            CheckResult(name, CheckStatus.SKIP, skipped)
            for name in ("seeding", "episodes_end", "observation_scale", "step_time")
        )
        return checks
    checks.append(_seeding_check(rollout.api, seed))
    if rollout.nonfinite is not None:  # the rollout stopped there: too little to judge by
        skipped = "not run: the observations check failed"
        checks.extend(
            CheckResult(name, CheckStatus.SKIP, skipped)
            for name in ("episodes_end", "observation_scale", "step_time")
        )
        return checks
    checks.append(rollout.episodes_check())
    checks.append(rollout.scale_check(normalize_observations))
    checks.append(rollout.time_check(slow_step_seconds))
    return checks


def _spaces_check(groups: list[_Group]) -> CheckResult:
    """The spaces DictGymWrapper and the networks take, for every group of agents: Box or
    Dict-of-Box observations, Box (finite bounds) or Discrete actions."""
    described = []
    for group in groups:
        problem = _spaces_problem(group.observation_space, group.action_space)
        named = f"group '{group.name}'" if group.name is not None else ""
        if problem is not None:
            detail = f"{named}: {problem[0]}" if named else problem[0]
            return CheckResult("spaces", CheckStatus.FAIL, detail, fix=problem[1])
        spaces = (
            f"observations {_space_text(group.observation_space)}, actions "
            f"{_space_text(group.action_space)}"
        )
        if named:
            plural = "s" if group.size > 1 else ""
            spaces = f"{named} ({group.size} agent{plural}): {spaces}"
        described.append(spaces)
    return CheckResult("spaces", CheckStatus.PASS, "; ".join(described))


def _spaces_problem(observation_space: Any, action_space: Any) -> tuple[str, str] | None:
    """``(detail, fix)`` when emote cannot take these spaces, else ``None``."""
    from gymnasium import spaces as gym_spaces

    from emote_core.spaces import MDPSpace

    fix = (
        "give the env a Box (or Dict of Box) observation space and a Box or Discrete action "
        "space, with finite action bounds"
    )
    if isinstance(action_space, gym_spaces.Discrete):
        actions: Any = gym_spaces.Discrete(int(action_space.n))  # DictGymWrapper offsets start
    else:
        actions = action_space
    try:
        MDPSpace.from_gymnasium(observation_space, actions)
    except EmoteError as error:
        return _describe(error), fix
    if isinstance(action_space, gym_spaces.Box):
        if not np.issubdtype(action_space.dtype, np.floating):
            return (
                f"Box actions of dtype {action_space.dtype}; emote's policies act in floats",
                "declare Box actions as float32 (or use a Discrete action space)",
            )
        bounds = np.concatenate([np.ravel(action_space.low), np.ravel(action_space.high)])
        if not np.all(np.isfinite(bounds)):
            return (
                f"action space {action_space} is unbounded; emote maps actions in [-1, 1] onto "
                "the bounds",
                "give the Box action space finite low and high",
            )
    return None


def _space_text(space: Any) -> str:
    from gymnasium import spaces as gym_spaces

    if isinstance(space, gym_spaces.Box):
        return f"Box{tuple(space.shape)} {space.dtype}"
    if isinstance(space, gym_spaces.Discrete):
        return f"Discrete({int(space.n)})"
    if isinstance(space, gym_spaces.Dict):
        inner = ", ".join(f"{key}: {_space_text(value)}" for key, value in space.spaces.items())
        return f"Dict({inner})"
    return type(space).__name__


def _observation_arrays(observation: Any) -> dict[str, np.ndarray] | None:
    """Box or Dict-of-Box observations as ``{key: array}``; ``None`` for other forms."""
    if isinstance(observation, Mapping):
        arrays = {}
        for key, value in observation.items():
            try:
                arrays[str(key)] = np.asarray(value)
            except Exception:  # a value numpy cannot hold: not a Box observation
                return None
        return arrays
    try:
        return {"obs": np.asarray(observation)}
    except Exception:  # as above
        return None


def _nonfinite(observation: Any) -> str | None:
    """The key of the first observation array holding NaN or inf, or ``None``."""
    arrays = _observation_arrays(observation) or {}
    for key, array in arrays.items():
        if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
            return key
    return None


def _outside(space: Any, observation: Any) -> tuple[CheckStatus, str] | None:
    """Why an observation is not in its space: a wrong dtype alone warns (emote casts it)."""
    from gymnasium import spaces as gym_spaces

    if isinstance(space, gym_spaces.Dict) and isinstance(observation, Mapping):
        if set(observation) != set(space.spaces):
            return CheckStatus.FAIL, (
                f"observation keys {sorted(map(str, observation))} differ from the space's "
                f"{sorted(map(str, space.spaces))}"
            )
        for key, inner in space.spaces.items():
            problem = _outside(inner, observation[key])
            if problem is not None:
                return problem[0], f"'{key}': {problem[1]}"
        return None
    if isinstance(space, gym_spaces.Box):
        array = np.asarray(observation)
        if array.shape != space.shape:
            return CheckStatus.FAIL, f"shape {array.shape}, the space declares {space.shape}"
        values = array.astype(np.float64)
        below = values < np.asarray(space.low, dtype=np.float64)
        above = values > np.asarray(space.high, dtype=np.float64)
        if np.any(below | above):
            index = np.unravel_index(int(np.argmax(below | above)), array.shape)
            return CheckStatus.FAIL, (
                f"value {values[index]:g} at index {tuple(int(i) for i in index)} is outside "
                f"the declared bounds [{np.asarray(space.low)[index]:g}, "
                f"{np.asarray(space.high)[index]:g}]"
            )
        if not np.can_cast(array.dtype, space.dtype):
            return CheckStatus.WARN, (
                f"dtype {array.dtype}, the space declares {space.dtype} (emote casts them)"
            )
        return None
    if not space.contains(observation):
        return CheckStatus.FAIL, f"{observation!r} is not in {space}"
    return None


def _sample(space: Any, observation: Any) -> Any:
    """A random action, among the legal ones where a Discrete space meets an ``action_mask``
    observation key (as emote's agents act)."""
    from gymnasium import spaces as gym_spaces

    if isinstance(space, gym_spaces.Discrete) and isinstance(observation, Mapping):
        mask = observation.get("action_mask")
        if mask is not None:
            legal = (np.asarray(mask).reshape(-1) != 0).astype(np.int8)
            if legal.shape == (int(space.n),) and legal.any():
                return space.sample(mask=legal)
    return space.sample()


def _no_legal_action(space: Any, observation: Any) -> bool:
    """Whether an ``action_mask`` observation key leaves a Discrete space no legal action."""
    from gymnasium import spaces as gym_spaces

    if not (isinstance(space, gym_spaces.Discrete) and isinstance(observation, Mapping)):
        return False
    mask = observation.get("action_mask")
    if mask is None:
        return False
    legal = np.asarray(mask).reshape(-1)
    return legal.shape == (int(space.n),) and not legal.any()


@dataclass
class _ScaleStats:
    """Running per-dimension sums of the observations of one key, shifted by the first one."""

    shift: np.ndarray
    total: np.ndarray
    squares: np.ndarray
    count: int = 0

    @classmethod
    def start(cls, array: np.ndarray) -> _ScaleStats:
        flat = array.astype(np.float64).ravel()
        return cls(flat.copy(), np.zeros_like(flat), np.zeros_like(flat))

    def add(self, array: np.ndarray) -> None:
        flat = array.astype(np.float64).ravel()
        if flat.shape != self.shift.shape:
            return  # a shape change is the observations check's failure
        delta = flat - self.shift
        self.total += delta
        self.squares += delta * delta
        self.count += 1

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        mean = self.total / self.count
        variance = np.maximum(self.squares / self.count - mean * mean, 0.0)
        return mean + self.shift, np.sqrt(variance)


@dataclass
class _Rollout:
    """One random-action rollout through an :class:`_Api` and what it showed."""

    fix_raised: ClassVar[str] = (
        "fix the env's error (make the env and call reset and step in Python for the traceback)"
    )

    api: _Api
    steps_played: int = 0
    step_seconds: float = 0.0
    episode_lengths: list[int] = field(default_factory=list)
    step_problem: str | None = None
    nonfinite: str | None = None
    outside: tuple[CheckStatus, str] | None = None
    stats: dict[str, _ScaleStats] = field(default_factory=dict)
    images: set[str] = field(default_factory=set)
    raised: bool = False
    last: dict[Any, Any] = field(default_factory=dict)
    masked_out: str | None = None

    @classmethod
    def play(cls, api: _Api, *, steps: int, seed: int) -> _Rollout:
        rollout = cls(api)
        with _quiet_warnings():
            rollout._play(steps, seed)
        return rollout

    def _play(self, steps: int, seed: int) -> None:
        api = self.api
        if not self._reset(seed):
            return
        api.seed_actions(seed)
        length = 0
        clock = time.perf_counter
        for index in range(steps):
            actions = api.sample(self.last)
            started = clock()
            try:
                result = api.step(actions)
            except Exception as error:  # the user's step: report it
                self.step_problem = f"step {index + 1} raised {_describe(error)}"
                self.raised = True
                return
            self.step_seconds += clock() - started
            self.steps_played += 1
            length += 1
            where = f"step {index + 1}"
            try:
                transitions = api.transitions(result)
            except _Malformed as problem:
                self.step_problem = f"{where}: {problem}"
                return
            self.last = {agent: t.observation for agent, t in transitions.items()}
            if not self._observe_agents(self.last, where):
                return
            for agent, transition in transitions.items():
                if not (transition.terminated or transition.truncated):
                    self._note_mask(agent, transition.observation, where)
            if not api.agents:
                self.episode_lengths.append(length)
                length = 0
                if index + 1 < steps and not self._reset(None):
                    return

    def _reset(self, seed: int | None) -> bool:
        try:
            observations = self.api.reset(seed)
        except _Malformed as problem:
            self.step_problem = str(problem)
            return False
        except Exception as error:  # the user's reset: report it
            self.step_problem = f"reset raised {_describe(error)}"
            self.raised = True
            return False
        self.last = observations
        for agent, observation in observations.items():
            if self.api.group(agent) is not None:
                self._note_mask(agent, observation, "reset")
        return self._observe_agents(observations, "reset")

    def _note_mask(self, agent: Any, observation: Any, where: str) -> None:
        """Records the first observation an episode goes on from with no legal action."""
        if self.masked_out is None and _no_legal_action(self.api.action_space(agent), observation):
            self.masked_out = (
                f"{self.api.where(where, agent)}: the action_mask allows no action and the "
                "episode goes on"
            )

    def _observe_agents(self, observations: dict[Any, Any], where: str) -> bool:
        """Records each agent's observation; False (stop) at an unknown agent or a non-finite
        observation."""
        for agent, observation in observations.items():
            group = self.api.group(agent)
            if group is None:
                self.step_problem = f"{where}: agent '{agent}' is not in possible_agents"
                return False
            space = self.api.observation_space(agent)
            if not self._observe(observation, space, self.api.where(where, agent), group):
                return False
        return True

    def _observe(self, observation: Any, space: Any, where: str, group: str = "") -> bool:
        """Records an observation; False (stop) when it is not finite."""
        key = _nonfinite(observation)
        if key is not None:
            self.nonfinite = f"{where}: observation '{key}' holds NaN or inf"
            return False
        if self.outside is None or self.outside[0] is CheckStatus.WARN:
            problem = _outside(space, observation)
            if problem is not None and (self.outside is None or problem[0] is CheckStatus.FAIL):
                self.outside = (problem[0], f"{where}: {problem[1]}")
        for name, array in (_observation_arrays(observation) or {}).items():
            key = f"{group}/{name}" if group else name
            if array.dtype == np.uint8:
                self.images.add(key)  # the image encoder scales them
                continue
            if not np.issubdtype(array.dtype, np.number):
                continue
            if key in self.stats:
                self.stats[key].add(array)
            else:
                self.stats[key] = _ScaleStats.start(array)
                self.stats[key].add(array)
        return True

    def step_check(self) -> CheckResult:
        if self.step_problem is not None:
            return CheckResult(
                "step",
                CheckStatus.FAIL,
                self.step_problem,
                fix=self.fix_raised if self.raised else self.api.fix_returned,
            )
        return CheckResult(
            "step",
            CheckStatus.PASS,
            f"{self.steps_played} steps returned {self.api.returned}",
        )

    def observations_check(self) -> CheckResult:
        if self.nonfinite is not None:
            return CheckResult(
                "observations",
                CheckStatus.FAIL,
                self.nonfinite,
                fix="return finite observations (no NaN or inf) from reset and step",
            )
        if self.step_problem is not None:
            return CheckResult("observations", CheckStatus.SKIP, "not run: the step check failed")
        if self.masked_out is not None:
            return CheckResult(
                "observations",
                CheckStatus.FAIL,
                self.masked_out,
                fix="leave at least one action legal (1 in action_mask) while an episode goes on",
            )
        if self.outside is not None:
            status, detail = self.outside
            fix = (
                "return observations of the declared dtype"
                if status is CheckStatus.WARN
                else "return observations inside the declared observation space (or widen it)"
            )
            return CheckResult("observations", status, detail, fix=fix)
        return CheckResult(
            "observations", CheckStatus.PASS, "finite and inside the declared observation space"
        )

    def episodes_check(self) -> CheckResult:
        if not self.episode_lengths:
            return CheckResult(
                "episodes_end",
                CheckStatus.WARN,
                f"no episode ended in {self.steps_played} steps of random actions",
                fix="set [env] max_episode_steps",
            )
        count = len(self.episode_lengths)
        mean = sum(self.episode_lengths) / count
        return CheckResult(
            "episodes_end",
            CheckStatus.PASS,
            f"{count} episode{'s' if count > 1 else ''} ended in {self.steps_played} steps "
            f"(mean length {mean:.1f})",
        )

    def scale_check(self, normalize_observations: bool) -> CheckResult:
        large: list[str] = []
        for key, stats in self.stats.items():
            if stats.count == 0:
                continue
            mean, std = stats.mean_std()
            for index in np.flatnonzero(
                (np.abs(mean) > OBSERVATION_SCALE_LIMIT) | (std > OBSERVATION_SCALE_LIMIT)
            ):
                large.append(f"{key}[{index}] mean {mean[index]:.3g} std {std[index]:.3g}")
        if not large:
            images = ", ".join(f"'{key}'" for key in sorted(self.images))
            plural = "s" if len(self.images) > 1 else ""
            verb = "are" if plural else "is"
            scaled = f"uint8 image{plural} {images} {verb} scaled by the image encoder"
            if not any(stats.count for stats in self.stats.values()):
                return CheckResult("observation_scale", CheckStatus.PASS, scaled)
            within = f"every dimension has |mean| and std within {OBSERVATION_SCALE_LIMIT:g}"
            detail = f"{within}; {scaled}" if self.images else within
            return CheckResult("observation_scale", CheckStatus.PASS, detail)
        shown = ", ".join(large[:3]) + (f" and {len(large) - 3} more" if len(large) > 3 else "")
        if normalize_observations:
            return CheckResult(
                "observation_scale",
                CheckStatus.PASS,
                f"{shown}; the recipe normalises observations",
            )
        return CheckResult(
            "observation_scale",
            CheckStatus.WARN,
            f"{len(large)} dimension{'s' if len(large) > 1 else ''} beyond "
            f"{OBSERVATION_SCALE_LIMIT:g}: {shown}",
            fix=_NORMALIZE_FIX,
        )

    def time_check(self, slow_step_seconds: float) -> CheckResult:
        mean = self.step_seconds / max(self.steps_played, 1)
        rate = 1.0 / mean if mean > 0 else math.inf
        detail = f"{mean * 1e3:.3g} ms per step (about {_rate_text(rate)} steps/s per env)"
        if mean > slow_step_seconds:
            return CheckResult(
                "step_time",
                CheckStatus.WARN,
                f"{detail}; above {slow_step_seconds * 1e3:g} ms, stepping limits collection",
                fix="step several envs together ([env] num_envs) or collect with "
                "'emote collect --workers'",
            )
        return CheckResult("step_time", CheckStatus.PASS, detail)


def _rate_text(rate: float) -> str:
    if not math.isfinite(rate):
        return "unmeasurably many"
    return f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"


def _equal(first: Any, second: Any) -> bool:
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return set(first) == set(second) and all(_equal(first[k], second[k]) for k in first)
    try:
        return bool(np.array_equal(np.asarray(first), np.asarray(second), equal_nan=True))
    except (TypeError, ValueError):  # values numpy cannot compare
        return bool(first == second)


def _replay(
    api: _Api, seed: int, plan: list[dict[Any, Any]]
) -> tuple[dict[Any, Any], list[dict[Any, _Transition]]]:
    """Resets with ``seed`` and steps the joint actions in ``plan`` or, while it is empty, up to
    SEEDING_STEPS random legal ones drawn into it: the first observations and each step's
    transitions."""
    observations = api.reset(seed)
    start, trace, drawing = observations, [], not plan
    for index in range(SEEDING_STEPS if drawing else len(plan)):
        if not api.agents:
            break
        if drawing:
            plan.append(api.sample(observations))
        transitions = api.transitions(api.step(api.replayed(plan[index])))
        trace.append(transitions)
        observations = {agent: t.observation for agent, t in transitions.items()}
    return start, trace


def _seeding_check(api: _Api, seed: int) -> CheckResult:
    """Two resets with one seed give equal observations; the same actions, equal rewards."""
    api.seed_actions(seed)
    plan: list[dict[Any, Any]] = []
    try:
        with _quiet_warnings():
            first_start, first = _replay(api, seed, plan)
            second_start, second = _replay(api, seed, plan)
    except Exception as error:  # the user's reset or step
        return CheckResult("seeding", CheckStatus.FAIL, _describe(error), fix=api.fix_seeding)
    problem = _replay_difference(api, (first_start, first), (second_start, second), seed)
    if problem is not None:
        return CheckResult("seeding", CheckStatus.FAIL, problem, fix=api.fix_seeding)
    return CheckResult(
        "seeding",
        CheckStatus.PASS,
        f"reset(seed={seed}) and {len(first)} equal {api.actions_text} replay the same "
        "observations and rewards",
    )


def _replay_difference(
    api: _Api,
    first: tuple[dict[Any, Any], list[dict[Any, _Transition]]],
    second: tuple[dict[Any, Any], list[dict[Any, _Transition]]],
    seed: int,
) -> str | None:
    """The first way two replays of one seed and plan differ, or ``None``."""
    if not _equal(first[0], second[0]):
        return f"two resets with seed {seed} gave different observations"
    same = f"the same seed and {api.actions_text}"
    for index, (step_a, step_b) in enumerate(zip(first[1], second[1], strict=False)):
        if set(step_a) != set(step_b):
            return f"{same} gave different observations at step {index + 1}"
        for agent, a in step_a.items():
            b = step_b[agent]
            where = api.where(f"step {index + 1}", agent)
            if not _equal(a.reward, b.reward):
                return f"{same} gave rewards {a.reward!r} and {b.reward!r} at {where}"
            if not _equal(a.observation, b.observation):
                return f"{same} gave different observations at {where}"
    if len(first[1]) != len(second[1]):
        return f"{same} ended the episode after {len(first[1])} and {len(second[1])} steps"
    return None
