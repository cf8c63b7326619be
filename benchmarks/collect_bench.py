"""Collection speed: emote collecting into a Zarr store against bare gymnasium vector-env stepping.

For Pendulum-v1 (``sac_pendulum``) and CartPole-v1 (``dqn_cartpole``), with 1 and 8 envs, side
by side in one run (env steps/s, median of ``--repeats``; the two sides of a ratio alternate and
the ratio is the median of the pairs' ratios):

* random policy: ``bare`` vector-env stepping with pre-drawn actions; ``emote`` collecting into a
  Zarr store in this process (``collect_to_store``, what ``emote collect`` runs), timed from
  after its setup to its last running report (every step taken, every commit that fell due
  made), the seconds of its final cut and commit printed beside it; ``in turns``: the two
  again, taking turns every collector call (64 vector steps, 512 steps of one env) in one run,
  each timed on its own, so that both see the same seconds of the machine; ``cli``: the figure
  ``emote collect --json`` reports from a subprocess (final commit included). The issue's
  targets: >= 0.9x bare with 8 envs, >= 0.75x with 1 env.
* a real torch policy (the recipe's acting network, untrained: SAC's Gaussian policy, DQN's
  epsilon-greedy Q network): ``bare+forward`` steps with pre-drawn actions and runs the same
  agent's batched forward on every step's observations; ``emote`` collects with that agent. The
  target: the forward pass is the only extra cost of note, so the same ratios.
* ``--details`` adds the figures ``train_bench.py`` printed before: a ``floor`` for any per-step
  Python collector (actions drawn, every step written into per-env numpy rows) and the
  ``training`` path (GymCollector, MemoryTableProxy and store appends, as ``emote train``
  collects).

The final commit is a fixed cost per run (zarr appends, whatever the batch size); over a short
run it would hide the steady rate, which is what the targets are about. In a
long run a commit falls due every 16 MB or 10 s and counts in the ``emote`` figure.

Each figure runs 160k env steps by default: shorter runs' ratios swing widely between pairs.

Run: ``python benchmarks/collect_bench.py`` (CPU; torch runs on one thread; ``--cpu-time`` on a
machine shared with other work).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
import torch

from emote_core.assembly.builders import make_agent, make_env, make_networks
from emote_core.assembly.collection import FLUSH_BYTES, CollectionProgress, collect_to_store
from emote_core.env import DictGymWrapper, GymCollector, make_vector_env
from emote_core.memory import DictObsMemoryTable, MemoryTableProxy
from emote_core.proxies import RandomAgentProxy
from emote_core.recipes import load_recipe
from emote_core.stores.provenance import PolicyKind, PolicyRecord

RECIPES = {"Pendulum-v1": "sac_pendulum", "CartPole-v1": "dqn_cartpole"}
CASES = (("Pendulum-v1", 1), ("Pendulum-v1", 8), ("CartPole-v1", 1), ("CartPole-v1", 8))
TARGETS = {1: 0.75, 8: 0.9}
CLOCK = time.perf_counter
"""Wall time; ``--cpu-time`` switches to this process's CPU time (all its threads), steadier on
a machine that other work shares."""


def bare_rate(env_id: str, num_envs: int, vector_steps: int, forward: Any = None) -> float:
    """Env steps/s of the vector env stepped with pre-drawn actions; with ``forward`` (an agent
    with ``act_batch``) its batched forward also runs on every step's observations."""
    env = make_vector_env(env_id, num_envs=num_envs)
    observations, _ = env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(vector_steps)]
    started = CLOCK()
    if forward is None:
        for action in actions:
            env.step(action)
    else:
        act = forward.act_batch
        for action in actions:
            act({"obs": observations})
            observations = env.step(action)[0]
    rate = vector_steps * num_envs / (CLOCK() - started)
    env.close()
    return rate


def _collect(
    env_id: str,
    num_envs: int,
    steps: int,
    directory: str,
    agent: Any,
    on_progress: Callable[[CollectionProgress], None],
) -> None:
    """``collect_to_store`` into a fresh store, with the random policy or ``agent`` (through
    the path a checkpoint's agent takes)."""
    recipe = load_recipe(RECIPES[env_id])
    out = tempfile.mkdtemp(dir=directory, suffix=".zarr")
    options: dict[str, Any] = {"steps": steps, "num_envs": num_envs, "count_store": False,
                               "on_progress": on_progress}  # fmt: skip
    if agent is None:
        collect_to_store(recipe, out, **options)
        return
    record = PolicyRecord(PolicyKind.RANDOM)  # provenance only: the store is thrown away
    with mock.patch(
        "emote_core.assembly.compatibility.collect_agent", return_value=(agent, record)
    ):
        collect_to_store(recipe, out, policy="bench", **options)


def emote_rate(
    env_id: str, num_envs: int, steps: int, directory: str, agent: Any = None
) -> tuple[float, float]:
    """``collect_to_store`` into a fresh store: env steps/s from its start report (after the
    setup) to its last running report (every step taken, every commit that fell due made), and
    the seconds of what follows (the last cut and the final commit); with ``agent``, acting with
    it instead of the random policy."""
    times: dict[str, float] = {}

    def on_progress(progress: CollectionProgress) -> None:
        times[progress.phase] = CLOCK()

    _collect(env_id, num_envs, steps, directory, agent, on_progress)
    return steps / (times["running"] - times["start"]), times["end"] - times["running"]


def interleaved_rates(
    env_id: str, num_envs: int, steps: int, directory: str, agent: Any = None
) -> tuple[float, float]:
    """Bare stepping and ``collect_to_store`` taking turns: after each collector call, a second
    vector env steps as many vector steps with pre-drawn actions (and ``agent``'s batched
    forward pass on each step's observations, with a policy), timed on its own and taken out
    of the collection's time. The two share every second of the machine's drift. Returns both
    env steps/s: ``(bare, emote)``."""
    bare = make_vector_env(env_id, num_envs=num_envs)
    observations = [bare.reset(seed=0)[0]]
    bare.action_space.seed(0)
    actions = np.stack([bare.action_space.sample() for _ in range(-(-steps // num_envs))])
    act = agent.act_batch if agent is not None else None
    done, spent, times = [0], [0.0], {}

    def on_progress(progress: CollectionProgress) -> None:
        times[progress.phase] = CLOCK()
        if progress.phase == "running":
            started, step = CLOCK(), bare.step
            for action in actions[done[0] : progress.env_steps // num_envs]:
                if act is None:
                    step(action)
                else:
                    act({"obs": observations[0]})
                    observations[0] = step(action)[0]
            done[0] = progress.env_steps // num_envs
            spent[0] += CLOCK() - started
            times["running"] = CLOCK()  # the collection's time resumes here

    _collect(env_id, num_envs, steps, directory, agent, on_progress)
    bare.close()
    collected = times["running"] - times["start"] - spent[0]
    return done[0] * num_envs / spent[0], steps / collected


def cli_rate(env_id: str, num_envs: int, steps: int, directory: str) -> float:
    """``emote collect RECIPE --steps N --envs K --json``'s own env steps/s (setup excluded)."""
    out = tempfile.mkdtemp(dir=directory, suffix=".zarr")
    command = [sys.executable, "-m", "emote_cli", "collect", RECIPES[env_id], "--out", out,
               "--steps", str(steps), "--envs", str(num_envs), "--json", "-q"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(json.loads(result.stdout)["env_steps_per_second"])


def torch_agent(env_id: str, num_envs: int) -> Any:
    """The recipe's acting agent with fresh (untrained) networks on the CPU, in eval mode as
    ``load_trained_agent`` gives a checkpoint's to ``emote collect --policy``."""
    recipe = load_recipe(RECIPES[env_id])
    env = make_env(recipe, num_envs=num_envs)
    device = torch.device("cpu")
    networks = make_networks(recipe, env.spaces, device)
    networks.acting.eval()
    env.close()
    return make_agent(recipe, networks, env.spaces, device, deterministic=False)


def floor_rate(env_id: str, num_envs: int, vector_steps: int) -> float:
    """The least a Python collector does per vector step: draw the actions, step, and write
    actions, rewards and observations into per-env rows (episode ends only rewind a cursor)."""
    env = make_vector_env(env_id, num_envs=num_envs)
    rng = np.random.default_rng(0)
    n, space = env.num_envs, env.single_action_space
    observations, _ = env.reset(seed=1)
    capacity = 1_001
    obs_rows = np.zeros((n, capacity, *observations.shape[1:]), dtype=np.float32)
    action_rows = np.zeros((n, capacity, *space.shape), dtype=np.float32)
    reward_rows = np.zeros((n, capacity), dtype=np.float32)
    cursor, slots = np.zeros(n, dtype=np.int64), np.arange(n)
    discrete = isinstance(space, gym.spaces.Discrete)
    started = CLOCK()
    for _ in range(vector_steps):
        if discrete:
            actions = rng.integers(0, space.n, size=n)
        else:
            width = space.high - space.low
            actions = (space.low + rng.random((n, *space.shape)) * width).astype(space.dtype)
        observations, rewards, terminated, truncated, _ = env.step(actions)
        action_rows[slots, cursor] = actions
        reward_rows[slots, cursor] = rewards
        cursor += 1
        obs_rows[slots, cursor] = observations
        cursor[terminated | truncated] = 0
        cursor %= capacity - 1
    rate = vector_steps * n / (CLOCK() - started)
    env.close()
    return rate


def training_path_rate(env_id: str, num_envs: int, vector_steps: int, directory: str) -> float:
    """Env steps/s of the training path: GymCollector feeding a MemoryTableProxy, whose finished
    episodes are appended to a store in batches of about ``FLUSH_BYTES``; timed, like ``emote``,
    up to the final append (a fixed cost per run)."""
    from emote_core.stores.zarr_store.tables import StoreAppender

    env = DictGymWrapper(make_vector_env(env_id, num_envs=num_envs))
    table = DictObsMemoryTable(spaces=env.spaces, maxlen=1_000_000)
    proxy = MemoryTableProxy(table)
    pending: list = []
    held = [0]  # bytes of the pending episodes

    def listener(*episode: Any) -> None:
        pending.append(episode)
        held[0] += sum(v.nbytes for v in episode[1].values())

    proxy.episode_listeners.append(listener)
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    collector = GymCollector(env=env, agent=agent, memory=proxy, seed=0)
    appender = StoreAppender(tempfile.mkdtemp(dir=directory, suffix=".zarr"), table)
    started = CLOCK()
    for _ in range(vector_steps // 100):
        collector.collect(100)
        if held[0] >= FLUSH_BYTES:
            appender.append(pending)
            pending.clear()
            held[0] = 0
    rate = vector_steps * num_envs / (CLOCK() - started)
    appender.append(pending)
    appender.close()
    env.close()
    return rate


def paired(
    repeats: int, reference: Callable[[], float], measure: Callable[[], tuple[float, float]]
) -> tuple[float, float, float, float]:
    """``repeats`` runs of ``reference`` (a rate) and ``measure`` (a rate and its final
    commit's seconds) back to back: the median of each figure and of the pairs' ratios (the
    machine's speed drifts over seconds: a pair shares it)."""
    references, rates, commits = [], [], []
    for _ in range(repeats):
        references.append(reference())
        rate, commit = measure()
        rates.append(rate)
        commits.append(commit)
    ratio = statistics.median(r / b for r, b in zip(rates, references, strict=True))
    return (statistics.median(references), statistics.median(rates), ratio,
            statistics.median(commits))  # fmt: skip


def _in_turns(
    env_id: str,
    num_envs: int,
    steps: int,
    directory: str,
    repeats: int,
    target: float,
    agent: Any = None,
) -> str:
    """The ``in turns`` figures of a case: medians of ``repeats`` runs."""
    turns = [interleaved_rates(env_id, num_envs, steps, directory, agent) for _ in range(repeats)]
    return (f" | in turns: bare{'+forward' if agent is not None else ''} "
            f"{statistics.median(b for b, _ in turns):7.0f} emote "
            f"{statistics.median(e for _, e in turns):7.0f} "
            f"{_verdict(statistics.median(e / b for b, e in turns), target)}")  # fmt: skip


def _verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f} (target >= {target}: {'met' if ratio >= target else 'MISSED'})"


def report(
    steps: int, repeats: int, *, cli: bool = True, policy: bool = True, details: bool = False
) -> None:
    """Prints every case's figures and ratios beside their targets."""
    torch.set_num_threads(1)
    clock = "CPU time" if CLOCK is time.process_time else "wall time"
    print(f"collect_bench: env steps/s ({clock}), median of {repeats}, {steps} env steps per "
          "random-policy figure, a quarter of that with a policy. emote: collect_to_store up to "
          "its final commit, whose seconds follow it; cli: `emote collect --json`'s own figure, "
          "final commit included")  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        for env_id, num_envs in CASES:
            target = TARGETS[num_envs]
            vector_steps = steps // num_envs
            bare, emote, ratio, commit = paired(
                repeats,
                lambda: bare_rate(env_id, num_envs, vector_steps),  # noqa: B023
                lambda: emote_rate(env_id, num_envs, steps, directory),  # noqa: B023
            )
            line = (f"  {env_id:<12}{num_envs:>2} envs random: bare {bare:7.0f} | emote "
                    f"{emote:7.0f} {_verdict(ratio, target)} + {commit:.2f} s")  # fmt: skip
            line += _in_turns(env_id, num_envs, steps, directory, repeats, target)
            if cli:
                cli_figure = cli_rate(env_id, num_envs, steps, directory)
                line += f" | cli {cli_figure:7.0f} ({cli_figure / bare:.2f})"
            if details:
                floor = floor_rate(env_id, num_envs, vector_steps)
                training = training_path_rate(env_id, num_envs, vector_steps, directory)
                line += (f" | floor {floor:7.0f} ({floor / bare:.2f}) | training "
                         f"{training:7.0f} ({training / bare:.2f})")  # fmt: skip
            print(line, flush=True)
            if policy:
                agent = torch_agent(env_id, num_envs)
                policy_steps = max(steps // 4, num_envs * 100)  # forward passes are slow
                reference, acting, ratio, commit = paired(
                    repeats,
                    lambda: bare_rate(env_id, num_envs, policy_steps // num_envs, agent),  # noqa: B023
                    lambda: emote_rate(env_id, num_envs, policy_steps, directory, agent),  # noqa: B023
                )
                turns = _in_turns(env_id, num_envs, policy_steps, directory, repeats, target, agent)
                print(f"  {env_id:<12}{num_envs:>2} envs {RECIPES[env_id]} policy: bare+forward "
                      f"{reference:7.0f} | emote {acting:7.0f} "
                      f"{_verdict(ratio, target)} + {commit:.2f} s{turns}",
                      flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=160_000, help="env steps per figure")
    parser.add_argument("--repeats", type=int, default=3, help="figures per side (median)")
    parser.add_argument("--skip-cli", action="store_true", help="no `emote collect` subprocess")
    parser.add_argument("--skip-policy", action="store_true", help="no torch policy figures")
    parser.add_argument(
        "--details", action="store_true", help="also the per-step floor and the training path"
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="time by CPU time (the CLI figure stays wall)"
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    report(
        args.steps, args.repeats, cli=not args.skip_cli, policy=not args.skip_policy,
        details=args.details,
    )  # fmt: skip


if __name__ == "__main__":
    main()
