"""check_environment: a sound env passes; each defect fails (or warns) the check that names it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

from emote_core.env.checks import CheckStatus, EnvCheckReport, check_environment
from emote_core.errors import ConfigurationError

STEPS = 300


class PointEnv(gym.Env):
    """A point that moves by its action; episodes end after ``limit`` steps.

    Each keyword switches on one defect a user's env may have.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        *,
        limit: int | None = 20,
        scale: float = 1.0,
        four_values: bool = False,
        nan_at: int | None = None,
        unseeded: bool = False,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        float64_observations: bool = False,
    ) -> None:
        self.observation_space = observation_space or spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = action_space or spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.limit = limit
        self.scale = scale
        self.four_values = four_values
        self.nan_at = nan_at
        self.unseeded = unseeded
        self.float64_observations = float64_observations
        self._global = np.random.default_rng()  # ignores reset's seed when unseeded

    def _observation(self) -> np.ndarray:
        values = np.append(self.position, self.t / 10.0) * self.scale
        if self.nan_at is not None and self.t >= self.nan_at:
            values[0] = np.nan
        return values.astype(np.float64 if self.float64_observations else np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        source = self._global if self.unseeded else self.np_random
        self.position = source.uniform(-1.0, 1.0, size=2)
        self.t = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple:
        self.t += 1
        self.position = self.position + 0.1 * np.asarray(action, dtype=np.float64).reshape(-1)[:2]
        reward = float(-np.linalg.norm(self.position))
        terminated = self.limit is not None and self.t >= self.limit
        if self.four_values:
            return self._observation(), reward, terminated, {}
        return self._observation(), reward, terminated, False, {}


def check(
    steps: int = STEPS, normalize_observations: bool = False, **defects: Any
) -> EnvCheckReport:
    return check_environment(
        lambda: PointEnv(**defects),
        env="PointEnv",
        steps=steps,
        seed=3,
        normalize_observations=normalize_observations,
    )


def statuses(report: EnvCheckReport) -> dict[str, CheckStatus]:
    return {result.name: result.status for result in report.checks}


def result(report: EnvCheckReport, name: str) -> Any:
    return next(check for check in report.checks if check.name == name)


NAMES = [
    "made",
    "gymnasium_checker",
    "spaces",
    "step",
    "observations",
    "seeding",
    "episodes_end",
    "observation_scale",
    "step_time",
]


def test_a_sound_env_passes_every_check() -> None:
    report = check()
    assert [c.name for c in report.checks] == NAMES
    assert set(statuses(report).values()) == {CheckStatus.PASS}, report.to_json()
    assert report.passed
    assert result(report, "episodes_end").detail.startswith(f"{STEPS // 20} episodes ended")
    document = report.to_json()
    assert document["env"] == "PointEnv" and document["passed"] is True
    assert document["checks"][0] == {
        "name": "made",
        "status": "pass",
        "detail": "PointEnv (gymnasium Env)",
        "fix": None,
    }


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnasium_classics_pass(env_id: str) -> None:
    report = check_environment(lambda: gym.make(env_id), env=env_id, steps=STEPS)
    assert report.passed, report.to_json()
    # Their infinite observation bounds and Pendulum's [-2, 2] actions are handled by emote:
    # gymnasium's warnings about them are not the user's to fix.
    assert statuses(report)["gymnasium_checker"] is CheckStatus.PASS


def test_step_returning_four_values_fails_the_step_check() -> None:
    report = check(four_values=True)
    assert not report.passed
    step = result(report, "step")
    assert step.status is CheckStatus.FAIL
    assert "step returned 4 values; gymnasium's API returns 5" in step.detail
    assert "truncated" in step.fix
    assert statuses(report)["seeding"] is CheckStatus.SKIP


def test_nan_observations_fail_the_observations_check() -> None:
    report = check(nan_at=5)
    observations = result(report, "observations")
    assert observations.status is CheckStatus.FAIL
    assert observations.detail == "step 5: observation 'obs' holds NaN or inf"
    assert not report.passed


def test_seeding_that_ignores_the_seed_fails() -> None:
    report = check(unseeded=True)
    seeding = result(report, "seeding")
    assert seeding.status is CheckStatus.FAIL
    assert seeding.detail == "two resets with seed 3 gave different observations"
    assert "self.np_random" in seeding.fix
    assert statuses(report)["step"] is CheckStatus.PASS


def test_episodes_that_never_end_warn_without_failing() -> None:
    report = check(limit=None, steps=50)
    episodes = result(report, "episodes_end")
    assert episodes.status is CheckStatus.WARN
    assert episodes.detail == "no episode ended in 50 steps of random actions"
    assert episodes.fix == "set [env] max_episode_steps"
    assert report.passed


def test_huge_observations_warn_unless_the_recipe_normalises() -> None:
    report = check(scale=500.0)
    scale = result(report, "observation_scale")
    assert scale.status is CheckStatus.WARN
    assert scale.fix == "set [env] normalize_observations = true"
    assert "obs[0]" in scale.detail and "obs[1]" in scale.detail
    assert report.passed

    normalised = result(check(scale=500.0, normalize_observations=True), "observation_scale")
    assert normalised.status is CheckStatus.PASS
    assert "the recipe normalises observations" in normalised.detail


@pytest.mark.parametrize(
    ("space_kwargs", "expected", "fix"),
    [
        (
            {"observation_space": spaces.Tuple([spaces.Box(-1, 1, (3,), np.float32)])},
            "emote supports Box observations",
            "Box or Discrete action",
        ),
        (
            {"action_space": spaces.MultiDiscrete([3, 3])},
            "is a MultiDiscrete",
            "Box or Discrete action",
        ),
        (
            {"action_space": spaces.Box(-np.inf, np.inf, (2,), np.float32)},
            "is unbounded",
            "finite low and high",
        ),
    ],
    ids=["tuple-observations", "multidiscrete-actions", "unbounded-actions"],
)
def test_unsupported_spaces_fail_the_spaces_check(
    space_kwargs: dict[str, gym.Space], expected: str, fix: str
) -> None:
    report = check(**space_kwargs)
    spaces_check = result(report, "spaces")
    assert spaces_check.status is CheckStatus.FAIL
    assert expected in spaces_check.detail
    assert fix in spaces_check.fix
    assert not report.passed


def test_observations_outside_the_space_fail_and_a_wider_dtype_warns() -> None:
    narrow = spaces.Box(-0.5, 0.5, (3,), np.float32)
    outside = result(check(observation_space=narrow), "observations")
    assert outside.status is CheckStatus.FAIL
    assert "outside the declared bounds [-0.5, 0.5]" in outside.detail

    wide = result(check(float64_observations=True), "observations")
    assert wide.status is CheckStatus.WARN
    assert "dtype float64, the space declares float32" in wide.detail


def test_an_env_that_cannot_be_made_is_one_failed_check() -> None:
    def broken() -> gym.Env:
        raise ModuleNotFoundError("No module named 'mygame'")

    report = check_environment(broken, env="mygame:Game")
    assert [(c.name, c.status) for c in report.checks] == [("made", CheckStatus.FAIL)]
    assert report.checks[0].detail == "ModuleNotFoundError: No module named 'mygame'"

    not_an_env = check_environment(lambda: object(), env="x:y")
    assert not_an_env.checks[0].status is CheckStatus.FAIL
    assert "neither a gymnasium Env nor a PettingZoo ParallelEnv" in not_an_env.checks[0].detail


def test_step_time_warns_above_the_threshold() -> None:
    report = check_environment(PointEnv, env="PointEnv", steps=20, slow_step_seconds=0.0)
    step_time = result(report, "step_time")
    assert step_time.status is CheckStatus.WARN
    assert "num_envs" in step_time.fix and report.passed
    assert result(check(), "step_time").status is CheckStatus.PASS


def test_steps_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="steps must be a positive integer; got 0"):
        check_environment(PointEnv, env="PointEnv", steps=0)


def test_a_pettingzoo_parallel_env_gets_its_own_test_and_checks_per_group() -> None:
    from mpe2 import simple_adversary_v3

    report = check_environment(
        lambda: simple_adversary_v3.parallel_env(max_cycles=25), env="simple_adversary", steps=100
    )
    assert report.passed, report.to_json()
    assert [c.name for c in report.checks] == [
        "made", "pettingzoo_api", *NAMES[2:],
    ]  # fmt: skip
    spaces_detail = result(report, "spaces").detail
    assert "group 'adversary' (1 agent)" in spaces_detail
    assert "group 'agent' (2 agents)" in spaces_detail
    assert result(report, "episodes_end").detail.startswith("4 episodes ended in 100 steps")


def test_a_parallel_env_with_unsupported_actions_fails_naming_its_group() -> None:
    report = check_environment(Grid, env="grid", steps=20)
    spaces_check = result(report, "spaces")
    assert spaces_check.status is CheckStatus.FAIL
    assert spaces_check.detail.startswith("group 'walker': space 'actions' is a MultiDiscrete")
    assert statuses(report)["pettingzoo_api"] is CheckStatus.PASS
    assert result(report, "episodes_end").detail.startswith("4 episodes ended in 20 steps")
    assert not report.passed


class Grid(ParallelEnv):
    """Two walkers for 5 steps; MultiDiscrete actions, which emote does not take."""

    metadata: dict[str, Any] = {"name": "grid_v0"}
    possible_agents = ["walker_0", "walker_1"]
    observation = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action = spaces.MultiDiscrete([3, 3])

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation

    def action_space(self, agent: str) -> gym.Space:
        return self.action

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        done = self.t >= 5
        observations = {a: np.zeros(2, np.float32) for a in self.agents}
        rewards = {a: 0.0 for a in self.agents}
        flags = {a: done for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return observations, rewards, flags, dict.fromkeys(flags, False), infos


def test_a_parallel_env_that_breaks_pettingzoos_api_fails_its_test() -> None:
    class CopyingGrid(Grid):
        def observation_space(self, agent: str) -> gym.Space:
            return spaces.Box(-1.0, 1.0, (2,), np.float32)  # a new object per call

    report = check_environment(CopyingGrid, env="grid", steps=20)
    api = result(report, "pettingzoo_api")
    assert api.status is CheckStatus.FAIL
    assert api.detail.startswith("observation_space should return the exact same space object")
    assert "pettingzoo.farama.org" in api.fix


def test_a_step_that_raises_fails_with_the_error_and_how_to_see_its_traceback() -> None:
    class Crashing(PointEnv):
        def step(self, action: Any) -> tuple:
            raise RuntimeError("the wall is not where it was")

    report = check_environment(Crashing, env="Crashing", steps=10)
    step = result(report, "step")
    assert step.detail == "step 1 raised RuntimeError: the wall is not where it was"
    assert "traceback" in step.fix
    assert statuses(report)["observations"] is CheckStatus.SKIP


def test_image_observations_are_left_to_the_image_encoder() -> None:
    report = check_environment(lambda: gym.make("emote/PixelPendulum-v0"), env="pix", steps=30)
    scale = result(report, "observation_scale")
    assert scale.status is CheckStatus.PASS
    assert scale.detail == "uint8 image 'obs' is scaled by the image encoder"


class OneLegalMove(gym.Env):
    """Only the move its ``action_mask`` allows is legal; another one ends the episode."""

    observation_space = spaces.Dict(
        {
            "obs": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "action_mask": spaces.Box(0, 1, (3,), np.int8),
        }
    )
    action_space = spaces.Discrete(3)

    def _observation(self) -> dict[str, np.ndarray]:
        mask = np.zeros(3, np.int8)
        mask[self.t % 3] = 1
        return {"obs": np.zeros(2, np.float32), "action_mask": mask}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple:
        if int(action) != self.t % 3:
            return self._observation(), -1.0, True, False, {}
        self.t += 1
        return self._observation(), 1.0, self.t >= 7, False, {}


def test_random_actions_respect_an_action_mask() -> None:
    report = check_environment(OneLegalMove, env="OneLegalMove", steps=70)
    assert report.passed, report.to_json()
    assert set(statuses(report).values()) == {CheckStatus.PASS}
    assert (
        result(report, "episodes_end").detail == "10 episodes ended in 70 steps (mean length 7.0)"
    )


def test_an_action_mask_that_allows_nothing_while_the_episode_goes_on_fails() -> None:
    class Stuck(OneLegalMove):
        def _observation(self) -> dict[str, np.ndarray]:
            observation = super()._observation()
            if self.t >= 2:
                observation["action_mask"][:] = 0
            return observation

    observations = result(check_environment(Stuck, env="Stuck", steps=30), "observations")
    assert observations.status is CheckStatus.FAIL
    assert observations.detail == (
        "step 2: the action_mask allows no action and the episode goes on"
    )
    assert "at least one action legal" in observations.fix


def test_a_parallel_env_whose_rewards_ignore_the_seed_fails_naming_the_agent() -> None:
    class UnseededGrid(Grid):
        """Rewards drawn from a generator that reset's seed never reaches."""

        action = spaces.Discrete(3)

        def step(self, actions: dict) -> tuple:
            observations, rewards, *rest = super().step(actions)
            drawn = np.random.default_rng().uniform(size=len(rewards))
            return (observations, dict(zip(rewards, drawn.tolist(), strict=True)), *rest)

    report = check_environment(UnseededGrid, env="grid", steps=20, seed=3)
    seeding = result(report, "seeding")
    assert seeding.status is CheckStatus.FAIL
    assert seeding.detail.startswith("the same seed and joint actions gave rewards ")
    assert seeding.detail.endswith(" at step 1, agent 'walker_0'")
    assert seeding.fix == "seed every random draw of reset and step from reset's seed"
    assert statuses(report)["step"] is CheckStatus.PASS and not report.passed
