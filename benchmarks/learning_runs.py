"""Running and reading the runs of benchmarks/learning.py: ``emote`` through its command line,
one seed's run of a comparison (:class:`SeedRun`), several at a time (:func:`run_all`), and what
the runs logged (TensorBoard scalars, wall time, targets) printed as tables."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def emote(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "emote_cli", *args, "--json", "-q"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode not in (0, 3):
        raise SystemExit(f"emote {' '.join(args)} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


EVAL_SEED = 1_000  # emote eval's default


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Scalars(tag)
    return [e.step for e in scalars], [e.value for e in scalars]


def scalars_or_none(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    """:func:`scalars`, or nothing for a run too short to have logged ``tag``."""
    try:
        return scalars(run_dir, tag)
    except KeyError:
        return [], []


def random_policy_return(episodes: int, recipe_name: str = "sac_pendulum") -> float:
    from emote_core.assembly.builders import make_env
    from emote_core.assembly.evaluation import evaluate
    from emote_core.proxies import RandomAgentProxy
    from emote_core.recipes import load_recipe

    recipe = load_recipe(recipe_name)
    env = make_env(recipe, num_envs=1)
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    env.close()
    return evaluate(agent, recipe, episodes=episodes, seed=EVAL_SEED)["mean_return"]


@dataclass
class SeedRun:
    """One seed's run of a comparison: trained, then evaluated with ``emote eval``."""

    label: str
    recipe: str
    seed: int
    settings: tuple[str, ...] = ()
    steps: int | None = None
    run_dir: Path = field(init=False)
    minutes: float = 0.0
    eval_return: float = float("nan")
    updates: int = 0
    reuse: bool = False

    def __post_init__(self) -> None:
        self.run_dir = Path("runs") / f"bench-{self.label}-s{self.seed}"

    def finished(self) -> bool:
        """Whether the run directory holds this run's final checkpoint already."""
        return (
            self.steps is not None
            and (self.run_dir / "checkpoints" / f"checkpoint_{self.steps}.tar").is_file()
        )

    def __call__(self) -> SeedRun:
        if self.reuse and self.finished():
            self.updates = int(self.steps or 0)
            self.eval_return = emote("eval", str(self.run_dir))["mean_return"]
            return self
        sets = [item for setting in self.settings for item in ("--set", setting)]
        steps = ["--steps", str(self.steps)] if self.steps is not None else []
        started = time.perf_counter()
        trained = emote("train", self.recipe, "--run-dir", str(self.run_dir), "--force",
                        "--seed", str(self.seed), "--threads", "1", *sets, *steps)  # fmt: skip
        self.minutes = (time.perf_counter() - started) / 60
        self.updates = int(trained["steps"])
        self.eval_return = emote("eval", str(self.run_dir))["mean_return"]
        return self


def run_all(runs: list[SeedRun], jobs: int) -> list[SeedRun]:
    """Trains and evaluates ``runs``, ``jobs`` at a time; prints each as it ends."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for done in as_completed([pool.submit(run) for run in runs]):
            run = done.result()
            print(f"  {run.label} seed {run.seed}: eval {run.eval_return:.1f} after "
                  f"{run.updates} updates, {run.minutes:.1f} min", flush=True)  # fmt: skip
    return runs


def spread(values: list[float], digits: int = 1) -> str:
    """``mean +- standard deviation (a, b, c)``."""
    import statistics

    deviation = statistics.pstdev(values) if len(values) > 1 else 0.0
    each = ", ".join(f"{value:.{digits}f}" for value in values)
    return f"{statistics.fmean(values):8.{digits}f} +- {deviation:6.{digits}f}   ({each})"


def side_by_side(title: str, groups: dict[str, list[float]], digits: int = 1) -> None:
    print(title)
    for label, values in groups.items():
        print(f"  {label:<34}{spread(values, digits)}")


def eval_cells(run: SeedRun, milestones: tuple[int, ...]) -> tuple[str, list[int], list[float]]:
    """The interval evals' mean return at the latest eval at or before each milestone, as table
    cells ('-': not reached), and the logged env steps and returns."""
    logged, returns = scalars_or_none(run.run_dir, "eval_env_step/mean_return")
    at = [latest_at_or_before(logged, returns, milestone) for milestone in milestones]
    return "".join(f"{v:>10.1f}" if v is not None else f"{'-':>10}" for v in at), logged, returns


def latest_at_or_before(steps: list[int], values: list[float], limit: int) -> float | None:
    """The value logged at the largest step <= ``limit``, if the run got within 250 of it."""
    chosen = [(s, v) for s, v in zip(steps, values, strict=True) if s <= limit]
    if not chosen or max(steps) < limit - 250:  # (not chosen: steps may be empty)
        return None
    return max(chosen)[1]


def wall_minutes(run: SeedRun) -> float:
    """Training wall time: from the first TensorBoard event to the last of each start of the run
    (each start, resumes included, writes its own event file), summed, so the time between a
    stop and its resume does not count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    total, found = 0.0, False
    for path in sorted((run.run_dir / "tensorboard").glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        times = [e.wall_time for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]
        if times:
            total, found = total + max(times) - min(times), True
    return total / 60 if found else float("nan")


def by_label(runs: list[SeedRun], figure: Any) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for run in sorted(runs, key=lambda run: run.seed):
        groups.setdefault(run.label, []).append(figure(run))
    return groups


def recipe_target(run_dir: Path) -> float | None:
    import tomllib

    recipe = tomllib.loads((run_dir / "recipe.toml").read_text())
    return recipe.get("eval", {}).get("min_return")
