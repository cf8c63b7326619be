"""Where one CPU thread's time goes in an offline family's update, emote's and d3rlpy's side by
side: milliseconds per update, and how many of them the matrix products take.

It bounds what any rewrite could gain: the matrix products are the arithmetic the algorithm
asks for (both libraries run the same ones), so a side whose total is T and whose products take
M per update can never be more than ``T_other / M`` times faster than the other side.

Both sides train on one fixed random batch of LunarLanderContinuous's shapes (8 observation
values, 2 actions) with the family's ``*_lunar_lander_continuous`` recipe settings and the same
d3rlpy config as ``offline_bench.py`` (``offline_d3rlpy.py``); d3rlpy runs in a child process
(emote's never imports it).

    python benchmarks/offline_profile.py --family cql --d3rlpy-path DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline_d3rlpy import ONE_THREAD, d3rlpy_algorithm, d3rlpy_config, run_d3rlpy_child

OBSERVATION_DIM = 8
ACTION_DIM = 2
MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
WARM_UP = 5


def profiled(run: Callable[[int], Any], updates: int) -> dict[str, float]:
    """Calls ``run(n)`` (``n`` updates) for WARM_UP updates, then for ``updates`` timed and for
    ``updates`` profiled; returns ``{ms_per_update, matmul_ms_per_update}``."""
    from torch.profiler import ProfilerActivity, profile

    run(WARM_UP)
    started = time.perf_counter()
    run(updates)
    total = (time.perf_counter() - started) / updates
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        run(updates)
    averages = recorded.key_averages()
    products = sum(e.self_cpu_time_total for e in averages if e.key in MATRIX_PRODUCTS)
    everything = sum(e.self_cpu_time_total for e in averages)
    # The profiler's own overhead inflates its total; its share of products is what is kept.
    return {
        "ms_per_update": 1e3 * total,
        "matmul_ms_per_update": 1e3 * total * products / everything,
    }


def batch_arrays(batch_size: int, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    generator = np.random.default_rng(seed)
    observations = generator.normal(size=(2, batch_size, OBSERVATION_DIM)).astype(np.float32)
    return {
        "observations": observations[0],
        "next_observations": observations[1],
        "actions": generator.uniform(-1, 1, (batch_size, ACTION_DIM)).astype(np.float32),
        "rewards": generator.normal(size=(batch_size, 1)).astype(np.float32),
    }  # fmt: skip


def emote_profile(
    family_name: str, batch_size: int, updates: int, compile_losses: bool = False
) -> dict[str, float]:
    """emote's update, run by its Trainer over the family's callbacks (their losses through
    ``torch.compile`` when ``compile_losses``, as ``training.compile = "compile"`` runs them)."""
    import numpy as np
    import torch

    from emote_core.algorithms.registry import BuildContext, get_algorithm
    from emote_core.callbacks.compiled import compile_methods
    from emote_core.recipes import load_recipe
    from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
    from emote_core.trainer import Trainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    f32 = np.dtype("float32")
    spaces = MDPSpace(
        rewards=BoxSpace(dtype=f32, shape=(1,)),
        actions=BoxSpace(dtype=f32, shape=(ACTION_DIM,), low=-1.0, high=1.0),
        state=DictSpace(spaces={"obs": BoxSpace(dtype=f32, shape=(OBSERVATION_DIM,))}),
    )
    family = get_algorithm(family_name)
    config = load_recipe(f"{family_name}_lunar_lander_continuous").config
    context = BuildContext(spaces=spaces, device=torch.device("cpu"))
    networks = family.make_networks(config, context)
    callbacks = family.training_parts(config, networks, context).callbacks
    if compile_losses:
        compile_methods(callbacks)
    arrays = {k: torch.from_numpy(v) for k, v in batch_arrays(batch_size).items()}
    batch = {
        "default": {
            "observation": {"obs": arrays["observations"]},
            "next_observation": {"obs": arrays["next_observations"]},
            "actions": arrays["actions"], "rewards": arrays["rewards"],
            "masks": torch.ones(batch_size, 1),
        },
        "batch_size": batch_size,
    }  # fmt: skip

    def run(updates: int) -> None:
        Trainer(callbacks, itertools.repeat(batch, updates)).train()

    return profiled(run, updates)


def d3rlpy_worker(family_name: str, batch_size: int, updates: int) -> None:
    """d3rlpy's update on the same batch; prints the profile as one JSON line."""
    import d3rlpy
    import numpy as np
    import torch
    from d3rlpy.dataset import TransitionMiniBatch

    from emote_core.recipes import load_recipe

    torch.set_num_threads(1)
    d3rlpy.seed(0)
    table = dataclasses.asdict(load_recipe(f"{family_name}_lunar_lander_continuous").config)
    algo = d3rlpy_algorithm(d3rlpy_config(family_name, table, batch_size))
    arrays = batch_arrays(batch_size)
    algo.create_impl((OBSERVATION_DIM,), ACTION_DIM)
    batch = TransitionMiniBatch(
        observations=arrays["observations"], actions=arrays["actions"],
        rewards=arrays["rewards"], next_observations=arrays["next_observations"],
        next_actions=arrays["actions"], terminals=np.zeros((batch_size, 1), np.float32),
        intervals=np.ones((batch_size, 1), np.float32), transitions=[],
    )  # fmt: skip

    def run(updates: int) -> None:
        for _ in range(updates):
            algo.update(batch)

    print(json.dumps(profiled(run, updates)))


def d3rlpy_profile(args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--family", args.family, "--batch-size",
               str(args.batch_size), "--updates", str(args.updates), "--d3rlpy-worker"]  # fmt: skip
    try:
        return run_d3rlpy_child(command, args.d3rlpy_path, what="d3rlpy's profile")
    except RuntimeError as error:
        raise SystemExit(str(error)) from None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=("bc", "iql", "cql"), default="cql")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--updates", type=int, default=20, help="Updates timed, and profiled.")
    parser.add_argument(
        "--d3rlpy-path", type=Path, default=None,
        help="d3rlpy's install folder (pip install --target); none: emote only.",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="emote's losses through torch.compile (training.compile = \"compile\").",
    )  # fmt: skip
    parser.add_argument("--d3rlpy-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.d3rlpy_worker:
        d3rlpy_worker(args.family, args.batch_size, args.updates)
        return
    os.environ.update(ONE_THREAD)
    sides = {"emote": emote_profile(args.family, args.batch_size, args.updates, args.compile)}
    if args.d3rlpy_path is not None:
        sides["d3rlpy"] = d3rlpy_profile(args)
    compiled = ", emote's losses compiled" if args.compile else ""
    print(f"{args.family}, batch {args.batch_size}, one thread, {args.updates} updates{compiled}")
    print(f"{'side':<8} {'ms/update':>10} {'matmul ms':>10} {'matmul share':>13}")
    for side, figures in sides.items():
        total, products = figures["ms_per_update"], figures["matmul_ms_per_update"]
        print(f"{side:<8} {total:>10.1f} {products:>10.1f} {100 * products / total:>12.0f}%")
    if "d3rlpy" in sides:
        emote, d3 = sides["emote"], sides["d3rlpy"]
        print(f"emote's speed over d3rlpy's: {d3['ms_per_update'] / emote['ms_per_update']:.2f}x; "
              f"with nothing but its matrix products left: at most "
              f"{d3['ms_per_update'] / emote['matmul_ms_per_update']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
