"""Does it learn? Trains shipped recipes with `emote train` and evaluates them with `emote eval`.

Each run goes through the CLI exactly as a user types it, into ``runs/bench-<recipe>``; the
figure printed is the mean deterministic return over the recipe's eval episodes, beside the
recipe's target and the rl-baselines3-zoo figure where one exists. Minutes per recipe on a CPU.

Run: ``python benchmarks/learning.py [RECIPE ...]`` (default: sac_hit_the_middle, sac_pendulum,
dqn_cartpole; add sac_lunar_lander for about an hour on a CPU, or on a GPU machine). ``offline``
as a name runs the offline check instead: ``emote collect`` 50k random Pendulum steps,
``emote train --memory STORE --no-live``, the Q loss's trend read back from TensorBoard, and
``emote eval`` beside a random policy's return.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ZOO = {
    "sac_pendulum": "-157 +- 89 at 20k steps",
    "dqn_cartpole": "500 at 50k steps",
    "sac_lunar_lander": "260 +- 65 at 500k steps",
}


def emote(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "emote_cli", *args, "--json", "-q"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode not in (0, 3):
        raise SystemExit(f"emote {' '.join(args)} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


OFFLINE_STEPS = 50_000
OFFLINE_UPDATES = 5_000
EVAL_SEED = 1_000  # emote eval's default


def offline(updates: int = OFFLINE_UPDATES) -> None:
    """Trains sac_pendulum from a store of random experience only and reports the Q loss trend."""
    import shutil

    root = Path("runs") / "bench-offline"
    shutil.rmtree(root, ignore_errors=True)
    store, run_dir = root / "random.zarr", root / "run"
    collected = emote("collect", "sac_pendulum", "--out", str(store), "--steps",
                      str(OFFLINE_STEPS), "--envs", "8")  # fmt: skip
    started = time.perf_counter()
    emote("train", "sac_pendulum", "--memory", str(store), "--no-live", "--steps", str(updates),
          "--run-dir", str(run_dir), "--set", "training.log_interval=10")  # fmt: skip
    seconds = time.perf_counter() - started
    report = emote("eval", str(run_dir))
    steps, losses = _scalars(run_dir, "loss_bp_step/q1")
    _, targets = _scalars(run_dir, "training_bp_step/q_target")
    # The values being fit grow as returns propagate (Q from ~-10 to ~-100 on Pendulum), so the
    # squared TD error is also shown relative to the squared mean target.
    relative = [loss / max(target**2, 1e-8) for loss, target in zip(losses, targets, strict=True)]
    tenth = max(len(losses) // 10, 1)
    lowest = min(range(len(losses)), key=losses.__getitem__)
    print(f"offline: {collected['transitions']} random transitions "
          f"({collected['env_steps_per_second']:.0f} env steps/s collecting), "
          f"{updates} updates in {seconds / 60:.1f} min")  # fmt: skip
    print(f"  Q1 loss (logged every 10 updates): {losses[0]:.3f} at update {steps[0]}, lowest "
          f"{losses[lowest]:.3f} at {steps[lowest]}, mean of the last tenth "
          f"{_mean(losses[-tenth:]):.3f}")  # fmt: skip
    print(
        f"  Q1 loss / mean target^2: first tenth {_mean(relative[:tenth]):.2e}, last tenth "
        f"{_mean(relative[-tenth:]):.2e}; mean target {targets[0]:.1f} -> {targets[-1]:.1f}"
    )
    print(
        f"  eval: {report['mean_return']:.1f} +- {report['std_return']:.1f}; random policy "
        f"{_random_return(report['episodes']):.1f} (same {report['episodes']} seeds)"
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _scalars(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Scalars(tag)
    return [e.step for e in scalars], [e.value for e in scalars]


def _random_return(episodes: int) -> float:
    from emote_core.assembly.builders import make_env
    from emote_core.assembly.evaluation import evaluate
    from emote_core.proxies import RandomAgentProxy
    from emote_core.recipes import load_recipe

    recipe = load_recipe("sac_pendulum")
    env = make_env(recipe, num_envs=1)
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    env.close()
    return evaluate(agent, recipe, episodes=episodes, seed=EVAL_SEED)["mean_return"]


def main() -> None:
    recipes = sys.argv[1:] or ["sac_hit_the_middle", "sac_pendulum", "dqn_cartpole"]
    if "offline" in recipes:
        recipes.remove("offline")
        offline()
    rows = []
    for recipe in recipes:
        run_dir = Path("runs") / f"bench-{recipe}"
        started = time.perf_counter()
        trained = emote("train", recipe, "--run-dir", str(run_dir), "--force")
        seconds = time.perf_counter() - started
        report = emote("eval", str(run_dir))
        target = _target(run_dir)
        rows.append((recipe, trained["steps"], seconds, report, target))
    if not rows:
        return
    print(f"{'recipe':<20}{'updates':>9}{'minutes':>9}{'mean return':>13}{'std':>8}"
          f"{'target':>9}  rl-baselines3-zoo")  # fmt: skip
    for recipe, steps, seconds, report, target in rows:
        mark = "" if target is None else (" ok" if report["mean_return"] >= target else " MISSED")
        print(f"{recipe:<20}{steps:>9}{seconds / 60:>9.1f}{report['mean_return']:>13.1f}"
              f"{report['std_return']:>8.1f}{target if target is not None else '-':>9}{mark}  "
              f"{ZOO.get(recipe, '-')}")  # fmt: skip


def _target(run_dir: Path) -> float | None:
    import tomllib

    recipe = tomllib.loads((run_dir / "recipe.toml").read_text())
    return recipe.get("eval", {}).get("min_return")


if __name__ == "__main__":
    main()
