"""Multi-agent collection speed: emote collecting a PettingZoo env into a Zarr store against bare
PettingZoo stepping with the same random actions.

mpe2's ``simple_spread_v3`` (continuous actions, ``max_cycles=25``) with N = 3 and N = 10 agents,
one env. ``bare``: ``env.step`` with every agent's action drawn uniformly in ``[-1, 1]`` and mapped
onto the action bounds, as emote's random agent draws them, and ``env.reset`` when no agent is
left. ``emote``: ``collect_to_store`` (what ``emote collect`` runs) with the random policy, every
agent life an episode committed to a store, timed from after its setup to its end (final commit
included). Both sides are timed in CPU seconds of this process (``time.process_time``), so that
other work on a shared machine does not count. The two sides take turns, ``--repeats`` pairs;
the ratio printed is the median of the pairs' ratios (env steps/s, each env step being one step
of all agents). Target: >= 0.85x.

Run: ``python benchmarks/multiagent_collect_bench.py [--env-steps 4000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from mpe2 import simple_spread_v3

from emote_core.assembly.collection import CollectionProgress, collect_to_store
from emote_core.recipes import load_recipe


def bare(agents: int, env_steps: int, seed: int) -> float:
    """Env steps per CPU second of plain PettingZoo stepping with uniform random actions."""
    env = simple_spread_v3.parallel_env(N=agents, max_cycles=25, continuous_actions=True)
    rng = np.random.default_rng(seed)
    space = env.action_space(env.possible_agents[0])
    half, middle = (space.high - space.low) / 2.0, (space.high + space.low) / 2.0
    env.reset(seed=seed)
    started = time.process_time()
    for _ in range(env_steps):
        if not env.agents:
            env.reset()
        drawn = rng.uniform(-1.0, 1.0, size=(len(env.agents), *space.shape)) * half + middle
        env.step({a: drawn[k].astype(space.dtype) for k, a in enumerate(env.agents)})
    seconds = time.process_time() - started
    env.close()
    return env_steps / seconds


def emote(agents: int, env_steps: int, seed: int, folder: Path) -> float:
    """Env steps per CPU second of ``collect_to_store`` with the random policy into a fresh
    store, from its first progress report (setup done) to its last (final commit made)."""
    recipe = load_recipe("sac_simple_spread")
    kwargs = {**recipe.env.kwargs, "N": agents}
    recipe = dataclasses.replace(
        recipe, seed=seed, env=dataclasses.replace(recipe.env, kwargs=kwargs)
    )
    out = folder / f"spread-{agents}-{seed}.zarr"
    marks: dict[str, float] = {}

    def mark(progress: CollectionProgress) -> None:
        marks[progress.phase] = time.process_time()

    result = collect_to_store(
        recipe, str(out), steps=env_steps * agents, command=["bench"], count_store=False,
        on_progress=mark,
    )  # fmt: skip
    return result.summary["env_steps"] / agents / (marks["end"] - marks["start"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=4_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'agents':>6} {'bare env steps/s':>17} {'emote env steps/s':>18} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as folder:
        for agents in (3, 10):
            pairs = []
            for repeat in range(args.repeats):
                plain = bare(agents, args.env_steps, repeat)
                ours = emote(agents, args.env_steps, repeat, Path(folder))
                pairs.append((plain, ours))
            ratio = statistics.median(o / p for p, o in pairs)
            plain = statistics.median(p for p, _ in pairs)
            ours = statistics.median(o for _, o in pairs)
            print(f"{agents:>6} {plain:>17,.0f} {ours:>18,.0f} {ratio:>5.2f}x")


if __name__ == "__main__":
    main()
