"""Collection throughput into one store with 1, 2, 4, ... Ray workers, and its scaling efficiency.

Each worker runs a random policy on its own vector env (``--envs`` slots) and writes its own shard
of one fresh store; every worker collects ``--steps-per-worker`` env steps (weak scaling), so
the steps per second per worker stay flat when collection scales perfectly. For each recipe the
table shows:

- bare gymnasium vector stepping (``make_vec``, sync, cached random actions), one process: the
  ceiling of one worker;
- ``emote collect`` in one process (no Ray): what a worker does, without Ray;
- N Ray workers: env steps/s of all of them together (from the first worker's first step to the
  last one's end, Ray's and the workers' start-up left out), per worker, and the efficiency
  ``(steps/s of N workers / N) / steps/s of 1 worker``.

Run: ``python benchmarks/collect_scaling.py [--max-workers N] [--steps-per-worker S]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from emote_core.assembly.collection import collect_to_store
from emote_core.recipes import load_recipe
from emote_core.scale.collection import RayCollection

RECIPES = ("sac_pendulum", "dqn_cartpole")


def worker_counts(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``, and ``most`` itself."""
    counts, count = [], 1
    while count < most:
        counts.append(count)
        count *= 2
    return [*counts, most]


def bare_vector_rate(env_id: str, num_envs: int, steps: int) -> float:
    """Env steps/s of gymnasium's sync vector env with random actions drawn up front."""
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(64)]
    vector_steps = steps // num_envs
    started = time.perf_counter()
    for index in range(vector_steps):
        env.step(actions[index % 64])
    seconds = time.perf_counter() - started
    env.close()
    return vector_steps * num_envs / seconds


def one_process_rate(recipe_name: str, num_envs: int, steps: int, folder: Path) -> float:
    """Env steps/s of the one-process collector into a fresh store."""
    result = collect_to_store(
        load_recipe(recipe_name), str(folder / "one.zarr"), steps=steps, num_envs=num_envs
    )
    return float(result.summary["env_steps_per_second"])


def ray_rates(
    recipe_name: str, workers: int, num_envs: int, steps: int, folder: Path
) -> tuple[float, float]:
    """Env steps/s of ``workers`` Ray workers together, and the mean of each worker's own."""
    collection = RayCollection(
        load_recipe(recipe_name),
        str(folder / f"ray{workers}.zarr"),
        workers=workers,
        steps=steps * workers,
        num_envs=num_envs,
    )
    summary = collection.run()
    if summary["lost_workers"] or summary["deaths"]:
        raise RuntimeError(f"workers died during the benchmark: {summary['deaths']}")
    each = [entry["env_steps_per_second"] for entry in summary["workers"]]
    return float(summary["collecting_env_steps_per_second"]), float(np.mean(each))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps-per-worker", type=int, default=200_000)
    parser.add_argument("--envs", type=int, default=8, help="vector env slots per worker")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    args = parser.parse_args()

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = os.pathsep.join(entry for entry in sys.path if entry)
    ray.init(
        num_cpus=args.max_workers,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    print(
        f"{os.cpu_count()} cores; {args.envs} envs per worker; {args.steps_per_worker} env steps "
        "per worker; random policy"
    )
    try:
        for recipe_name in args.recipes:
            env_id = load_recipe(recipe_name).env.id
            bare = bare_vector_rate(env_id, args.envs, args.steps_per_worker)
            with tempfile.TemporaryDirectory() as temporary:
                folder = Path(temporary)
                one = one_process_rate(recipe_name, args.envs, args.steps_per_worker, folder)
                print(f"\n{recipe_name} ({env_id})")
                print(f"  bare gymnasium make_vec(sync, {args.envs}): {bare:10.0f} env steps/s")
                print(f"  emote collect, one process:          {one:10.0f} env steps/s")
                print("  workers  env steps/s  per worker  efficiency")
                base = None
                for workers in worker_counts(args.max_workers):
                    total, each = ray_rates(
                        recipe_name, workers, args.envs, args.steps_per_worker, folder
                    )
                    base = base or total
                    efficiency = total / workers / base
                    print(f"  {workers:7d}  {total:11.0f}  {each:10.0f}  {efficiency:10.2f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
