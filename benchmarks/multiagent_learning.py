"""Multi-agent learning: a simple_spread recipe trained at a fixed budget against a random policy.

Trains ``RECIPE`` (default ``sac_simple_spread``: mpe2's simple_spread, 3 agents sharing one
policy) for ``--steps`` updates with ``emote train``, evaluates the run with ``emote eval`` over
``--episodes`` env episodes (deterministic), and evaluates a uniformly random policy on the same
env and seeds. Prints, per policy, the mean team return (all agents' returns of an env episode
summed) with its standard deviation, and the mean return per agent. For an env of several agent
groups (``sac_simple_adversary``: one policy per group, competing) also each group's return per
agent with every group random, with that group's trained policy against random others, and with
every group trained.

Run: ``python benchmarks/multiagent_learning.py [--recipe sac_simple_spread] [--steps 5000]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from emote_core.assembly.builders import load_trained_agent, make_env
from emote_core.assembly.evaluation import evaluate
from emote_core.env.multi_agent import GroupAgents, random_group_agents, several_groups
from emote_core.proxies import RandomAgentProxy
from emote_core.recipes import load_recipe


def emote(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "emote_cli", *args, "--json", "--quiet"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"emote {' '.join(args)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def line(name: str, report: dict) -> str:
    per_agent = np.mean([r for g in report["groups"].values() for r in g["returns"]])
    return (
        f"{name:<22} {report['mean_team_return']:>9.2f} ± {report['std_return']:<6.2f} "
        f"{per_agent:>10.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="sac_simple_spread")
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1_000)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    env = make_env(recipe, num_envs=1)
    if several_groups(env):  # one random agent per group of agents alike
        random_agent = random_group_agents(env, args.seed)
    else:
        random_agent = RandomAgentProxy(action_space=env.single_action_space, seed=args.seed)
    env.close()
    random = evaluate(random_agent, recipe, episodes=args.episodes, seed=args.seed)
    with tempfile.TemporaryDirectory() as folder:
        run = str(Path(folder) / "run")
        started = time.perf_counter()
        trained = emote("train", args.recipe, "--steps", str(args.steps), "--run-dir", run)
        seconds = time.perf_counter() - started
        report = emote("eval", run, "--episodes", str(args.episodes), "--seed", str(args.seed))
        against_random = {}
        if isinstance(random_agent, GroupAgents):  # each group trained, the others random
            _, _, trained_agents, _, _ = load_trained_agent(Path(run), device=torch.device("cpu"))
            for name in trained_agents.agents:
                mixed = dict(random_agent.agents, **{name: trained_agents.agents[name]})
                alone = evaluate(
                    GroupAgents(random_agent.env, mixed), recipe, episodes=args.episodes,
                    seed=args.seed,
                )  # fmt: skip
                against_random[name] = alone["groups"][name]["mean_return"]
    print(f"{args.recipe}: {args.steps} updates in {seconds:.0f} s ({trained['device']})")
    print(f"{'policy':<22} {'team return (mean ± std)':>26} {'per agent':>10}")
    print(line("random", random))
    print(line(f"{args.recipe} {args.steps}", report))
    if against_random:  # one policy per group: each group's return per agent
        print(f"{'return per agent':<22} {'all random':>10} {'vs random':>10} {'all trained':>12}")
        for name, group in report["groups"].items():
            before = random["groups"][name]["mean_return"]
            print(
                f"{name:<22} {before:>10.2f} {against_random[name]:>10.2f} "
                f"{group['mean_return']:>12.2f}"
            )


if __name__ == "__main__":
    main()
