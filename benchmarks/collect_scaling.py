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

``--launcher processes`` starts the N workers as plain OS processes instead of Ray actors (each
runs the same one-process collector on its own shard ``p<i>`` of one store; for machines without
Ray), and adds bare gymnasium stepping in N processes at once: the machine's own scaling ceiling.

Run: ``python benchmarks/collect_scaling.py [--max-workers N] [--steps-per-worker S]
[--launcher ray|processes]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _process_worker(job: tuple[str | None, str, str, int, int], barrier: Any, results: Any) -> None:
    """One process of ``--launcher processes``: bare stepping (``recipe`` None: ``env_id``) or
    the one-process collector on its own shard, started with the others at the barrier."""
    recipe_name, env_id, out, steps, num_envs = job
    recipe = load_recipe(recipe_name) if recipe_name else None
    barrier.wait()
    if recipe is None:
        rate = bare_vector_rate(env_id, num_envs, steps)
    else:
        shard = os.path.basename(out)
        result = collect_to_store(
            recipe, os.path.dirname(out), steps=steps, num_envs=num_envs, shard=shard,
            count_store=False,
        )  # fmt: skip
        rate = float(result.summary["env_steps_per_second"])
    ended = time.time()  # the stepping (or the collector's loop) began steps / rate before
    results.put((ended - steps / rate, ended, steps, rate))


def process_rates(
    recipe_name: str | None, env_id: str, workers: int, num_envs: int, steps: int, folder: Path
) -> tuple[float, float]:
    """Env steps/s of ``workers`` processes together (from the first one's first step to the
    last one's end: imports and env creation left out), and the mean of each one's own rate."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(workers), context.Queue()
    store = str(folder / f"processes{workers}.zarr")
    jobs = [(recipe_name, env_id, f"{store}/p{index}", steps, num_envs) for index in range(workers)]
    processes = [
        context.Process(target=_process_worker, args=(job, barrier, results)) for job in jobs
    ]
    for process in processes:
        process.start()
    ends = [results.get(timeout=3_600) for _ in processes]
    for process in processes:
        process.join()
        if process.exitcode:
            raise RuntimeError(f"a worker process failed with exit code {process.exitcode}")
    span = max(end for _, end, _, _ in ends) - min(start for start, _, _, _ in ends)
    total = sum(count for _, _, count, _ in ends)
    return total / span, float(np.mean([rate for *_, rate in ends]))


def _scaling_table(rates: Callable[[int], tuple[float, float]], most: int) -> None:
    print("  workers  env steps/s  per worker  efficiency")
    base = None
    for workers in worker_counts(most):
        total, each = rates(workers)
        base = base or total
        print(f"  {workers:7d}  {total:11.0f}  {each:10.0f}  {total / workers / base:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps-per-worker", type=int, default=200_000)
    parser.add_argument("--envs", type=int, default=8, help="vector env slots per worker")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--launcher", choices=("ray", "processes"), default="ray")
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} cores; {args.envs} envs per worker; {args.steps_per_worker} env steps "
        f"per worker; random policy; workers as {args.launcher}"
    )
    if args.launcher == "processes":
        _main_processes(args)
        return

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = os.pathsep.join(entry for entry in sys.path if entry)
    ray.init(
        num_cpus=args.max_workers,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
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
                _scaling_table(
                    lambda workers, name=recipe_name, folder=folder: ray_rates(
                        name, workers, args.envs, args.steps_per_worker, folder
                    ),
                    args.max_workers,
                )
    finally:
        ray.shutdown()


def _main_processes(args: argparse.Namespace) -> None:
    for recipe_name in args.recipes:
        env_id = load_recipe(recipe_name).env.id
        with tempfile.TemporaryDirectory() as temporary:
            for title, name in (
                (f"bare gymnasium make_vec(sync, {args.envs}) in N processes", None),
                ("emote collect, N processes into one store", recipe_name),
            ):
                print(f"\n{recipe_name} ({env_id}): {title}")
                rates = functools.partial(
                    _process_rates_of, name, env_id, args.envs, args.steps_per_worker,
                    Path(temporary),
                )  # fmt: skip
                _scaling_table(rates, args.max_workers)


def _process_rates_of(
    recipe_name: str | None, env_id: str, num_envs: int, steps: int, folder: Path, workers: int
) -> tuple[float, float]:
    return process_rates(recipe_name, env_id, workers, num_envs, steps, folder)


if __name__ == "__main__":
    main()
