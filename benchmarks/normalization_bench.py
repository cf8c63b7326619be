"""Does observation normalisation help on raw game units? SAC with and without it.

The environment is a point mass on a plane pushed towards the origin, whose observations are what
a game would send: positions and velocities in game units (x100) plus a constant offset of 300,
so every entry sits in the hundreds. Each seed trains the same recipe twice through the CLI,
``emote train`` with ``env.normalize_observations`` false and true, then ``emote eval`` plays
the same 20 episodes with each; the figure is the mean deterministic return (0 is perfect;
the return of doing nothing is printed beside).

Run: ``python benchmarks/normalization_bench.py [--seeds 0,1,2] [--steps 4000]``; runs go to
``runs/bench-normalization-*`` (``--reuse`` keeps finished ones).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

SCALE = 100.0
"""Game units per unit of the underlying state."""
OFFSET = 300.0
"""The constant a game's coordinates are offset by."""


class ScaledPointMass(gym.Env):
    """A point mass pushed towards the origin; observations in game units (hundreds).

    State: position and velocity in ``[-1, 1]^2`` each; action: a force in ``[-1, 1]^2``;
    reward: minus the distance to the origin per step; 100 steps per episode.
    """

    metadata = {"render_modes": []}

    def __init__(self, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.render_mode = render_mode
        self._state = np.zeros(4)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._state = np.concatenate([self.np_random.uniform(-1, 1, 2), np.zeros(2)])
        return self._observation(), {}

    def step(self, action):
        force = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        position, velocity = self._state[:2], self._state[2:]
        velocity = np.clip(0.9 * velocity + 0.1 * force, -1.0, 1.0)
        position = np.clip(position + 0.1 * velocity, -1.0, 1.0)
        self._state = np.concatenate([position, velocity])
        reward = -float(np.linalg.norm(position))
        return self._observation(), reward, False, False, {}

    def _observation(self) -> np.ndarray:
        return (self._state * SCALE + OFFSET).astype(np.float32)


RECIPE = """
algorithm = "sac"
seed = {seed}

[env]
entry_point = "normalization_bench:ScaledPointMass"
max_episode_steps = 100
normalize_observations = {normalize}

[memory]
batch_size = 128
warmup_steps = 1000

[training]
bp_steps = {steps}
checkpoint_interval = {steps}
log_interval = 1000

[sac]
hidden_dims = [64, 64]

[eval]
episodes = 20
interval = 0
"""


def run(seed: int, normalize: bool, steps: int, reuse: bool) -> tuple[float, float]:
    """Trains and evaluates one run; ``(mean eval return, wall seconds of training)``."""
    run_dir = Path("runs") / f"bench-normalization-{'on' if normalize else 'off'}-s{seed}"
    environ = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent),
               "OMP_NUM_THREADS": "1"}  # fmt: skip
    seconds = 0.0
    if not (reuse and (run_dir / "checkpoints" / f"checkpoint_{steps}.tar").exists()):
        with tempfile.TemporaryDirectory() as directory:
            recipe = Path(directory) / "point_mass.toml"
            text = RECIPE.format(seed=seed, normalize=str(normalize).lower(), steps=steps)
            recipe.write_text(text)
            start = time.perf_counter()
            subprocess.run(
                # --force replaces an earlier run there, and only what that run wrote
                ["emote", "train", str(recipe), "--run-dir", str(run_dir), "-q",
                 *(["--force"] if run_dir.exists() else [])],
                check=True, env=environ, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            seconds = time.perf_counter() - start
    evaluated = subprocess.run(
        ["emote", "eval", str(run_dir), "--episodes", "20", "--seed", "1000",
         "--min-return", "-1e9", "--json", "-q"],
        check=True, env=environ, capture_output=True, text=True,
    )  # fmt: skip
    return float(json.loads(evaluated.stdout)["mean_return"]), seconds


def idle_return(episodes: int = 20) -> float:
    """The mean return of doing nothing (zero force) over ``episodes`` seeded episodes."""
    env = ScaledPointMass()
    returns = []
    for seed in range(1000, 1000 + episodes):
        env.reset(seed=seed)
        returns.append(sum(env.step(np.zeros(2))[1] for _ in range(100)))
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    figures: dict[bool, list[float]] = {False: [], True: []}
    print(f"SAC on ScaledPointMass (observations x{SCALE:g} + {OFFSET:g}), {args.steps} updates")
    print(f"{'seed':>4}  {'raw':>9}  {'normalised':>10}")
    for seed in seeds:
        for normalize in (False, True):
            mean, _ = run(seed, normalize, args.steps, args.reuse)
            figures[normalize].append(mean)
        print(f"{seed:>4}  {figures[False][-1]:>9.1f}  {figures[True][-1]:>10.1f}", flush=True)
    for normalize, label in ((False, "raw"), (True, "normalised")):
        values = np.array(figures[normalize])
        print(f"{label}: mean {values.mean():.1f} +- {values.std():.1f} over {len(values)} seeds")
    print(f"doing nothing: {idle_return():.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
