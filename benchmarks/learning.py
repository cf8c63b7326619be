"""Does it learn? Trains shipped recipes with `emote train` and evaluates them with `emote eval`.

Each run goes through the CLI exactly as a user types it, into ``runs/bench-<recipe>``; the
figure printed is the mean deterministic return over the recipe's eval episodes, beside the
recipe's target and the rl-baselines3-zoo figure where one exists. Minutes per recipe on a CPU.

Run: ``python benchmarks/learning.py [RECIPE ...]`` (default: sac_hit_the_middle, sac_pendulum,
dqn_cartpole; add sac_lunar_lander on a GPU machine).
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


def main() -> None:
    recipes = sys.argv[1:] or ["sac_hit_the_middle", "sac_pendulum", "dqn_cartpole"]
    rows = []
    for recipe in recipes:
        run_dir = Path("runs") / f"bench-{recipe}"
        started = time.perf_counter()
        trained = emote("train", recipe, "--run-dir", str(run_dir), "--force")
        seconds = time.perf_counter() - started
        report = emote("eval", str(run_dir))
        target = _target(run_dir)
        rows.append((recipe, trained["steps"], seconds, report, target))
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
