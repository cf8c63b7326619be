"""d3rlpy's side of the offline benchmarks: the d3rlpy config of an emote recipe table, a store
written as the arrays an ``MDPDataset`` reads, and the child process that trains and evaluates
one d3rlpy algorithm.

``offline_bench.py`` and ``offline_profile.py`` import this module; only its child processes
import d3rlpy, which pins ``gymnasium==1.0.0`` and so lives in a folder of its own (see
``offline_bench.py``). A child is ``python offline_d3rlpy.py REQUEST.json`` with that folder on
its ``PYTHONPATH``; it prints ``{mean_return, seconds, threads, config}`` as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EVAL_SEED = 1_000
"""``emote eval``'s default seed of the evaluation env's first reset (the recipes' eval.seed)."""
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
WORKER = Path(__file__).resolve()
"""This file, which a d3rlpy child process runs."""


# Settings: d3rlpy's config of an emote recipe table's values.


def d3rlpy_config(family: str, table: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The d3rlpy config (class name and keyword arguments) of an emote family's recipe table.

    Raises:
        KeyError: If ``family`` has no d3rlpy counterpart here.
    """
    hidden = list(table["hidden_dims"])
    common: dict[str, Any] = {"batch_size": batch_size}
    if family == "bc":
        return {
            "class": "BCConfig",
            "kwargs": common | {"learning_rate": table["learning_rate"],
                                "policy_type": "deterministic"},
            "encoders": {"encoder_factory": hidden},
            "clipped_optimizers": {"optim_factory": table["max_grad_norm"]},
        }  # fmt: skip
    if family == "iql":
        return {
            "class": "IQLConfig",
            "kwargs": common | {
                "actor_learning_rate": table["learning_rate"],
                "critic_learning_rate": table["learning_rate"],
                "gamma": table["gamma"], "tau": table["tau"], "expectile": table["expectile"],
                "weight_temp": table["temperature"], "max_weight": table["max_weight"],
            },
            "encoders": {name: hidden for name in
                         ("actor_encoder_factory", "critic_encoder_factory",
                          "value_encoder_factory")},
            "clipped_optimizers": {name: table["max_grad_norm"] for name in
                                   ("actor_optim_factory", "critic_optim_factory")},
        }  # fmt: skip
    if family == "cql":
        return {
            "class": "CQLConfig",
            "kwargs": common | {
                "critic_learning_rate": table["learning_rate"],
                "actor_learning_rate": table["policy_learning_rate"],
                "temp_learning_rate": table["policy_learning_rate"],
                "gamma": table["gamma"], "tau": table["tau"],
                "conservative_weight": table["conservative_weight"],
                "n_action_samples": table["sampled_actions"],
                # A fixed penalty weight as emote's: alpha stays 1, so d3rlpy's threshold only
                # shifts the loss by a constant; SAC's entropy-regularised target as emote's.
                "alpha_learning_rate": 0.0, "initial_alpha": 1.0, "soft_q_backup": True,
            },
            "encoders": {name: hidden for name in
                         ("actor_encoder_factory", "critic_encoder_factory")},
            "clipped_optimizers": {name: table["max_grad_norm"] for name in
                                   ("actor_optim_factory", "critic_optim_factory")},
        }  # fmt: skip
    raise KeyError(family)


DIFFERENCES = {
    "bc": "both fit tanh(mean) by squared error, clipping gradient norms at bc.max_grad_norm",
    "iql": (
        "emote's policy is a tanh-squashed Gaussian with a state-dependent std, d3rlpy's an "
        "unsquashed Gaussian (mean tanh) with one learned log-std in [-5, 2]; neither decays "
        "the actor's learning rate; both clip gradient norms at iql.max_grad_norm (d3rlpy's "
        "actor and critic optimizers)"
    ),
    "cql": (
        "d3rlpy's Lagrangian alpha is off (alpha_learning_rate=0, alpha 1) so both use the "
        "fixed conservative_weight; emote bounds the temperature by cql.max_alpha; both clip "
        "the actor's and critics' gradient norms at cql.max_grad_norm"
    ),
}
"""What differs between the two sides beyond the matched settings."""


# Running d3rlpy (in a child process: emote's process never imports it).


def write_transitions(store: Path, destination: Path) -> dict[str, int]:
    """Writes a store's episodes as D4RL-style arrays (``observations``, ``actions``,
    ``rewards``, ``terminals``, ``timeouts``) into an ``.npz`` file for d3rlpy.

    An episode that ended TERMINAL keeps its N steps with ``terminals`` set on the last; one that
    was cut (INTERRUPTED) gets its final observation as an extra step (zero action and reward)
    with ``timeouts`` set, so d3rlpy's last transition of it bootstraps from the real next
    observation and it holds the same N transitions as emote's table.

    Returns:
        ``{episodes, transitions, terminal_episodes}``.
    """
    import numpy as np

    from emote_core.stores.zarr_store.reader import MemoryStore
    from emote_core.typing import EpisodeState

    opened = MemoryStore(store)
    spaces = opened.spaces or {}
    keys = sorted(spaces.get("state", {}).get("spaces", {}))
    parts: dict[str, list[Any]] = {k: [] for k in ("o", "a", "r", "t", "x")}
    episodes = transitions = terminal = 0
    for _, data, state in opened.episodes():
        observations = np.concatenate(
            [data[k].reshape(len(data[k]), -1) for k in keys], axis=1
        ).astype(np.float32)
        actions = data["actions"].reshape(len(data["actions"]), -1).astype(np.float32)
        rewards = data["rewards"].reshape(-1).astype(np.float32)
        n = len(rewards)
        ended = state == EpisodeState.TERMINAL
        steps = n if ended else n + 1
        flags = np.zeros(steps, np.float32)
        flags[-1] = 1.0
        parts["o"].append(observations[:steps])
        parts["a"].append(actions if ended else np.concatenate([actions, actions[:1] * 0]))
        parts["r"].append(rewards if ended else np.concatenate([rewards, np.zeros(1, np.float32)]))
        parts["t"].append(flags if ended else np.zeros(steps, np.float32))
        parts["x"].append(np.zeros(steps, np.float32) if ended else flags)
        episodes, transitions, terminal = episodes + 1, transitions + n, terminal + ended
    np.savez(
        destination,
        observations=np.concatenate(parts["o"]), actions=np.concatenate(parts["a"]),
        rewards=np.concatenate(parts["r"]), terminals=np.concatenate(parts["t"]),
        timeouts=np.concatenate(parts["x"]),
    )  # fmt: skip
    return {"episodes": episodes, "transitions": transitions, "terminal_episodes": terminal}


def run_d3rlpy_child(command: list[str], d3rlpy_path: Path, *, what: str) -> dict[str, Any]:
    """Runs ``command`` with one thread and d3rlpy's folder on its ``PYTHONPATH``; returns the
    JSON its last line prints.

    Raises:
        RuntimeError: If it fails, with the end of what it wrote to stderr.
    """
    paths = [str(d3rlpy_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    result = subprocess.run(
        command, env=os.environ | ONE_THREAD | {"PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def d3rlpy_algorithm(config: dict[str, Any]) -> Any:
    """The d3rlpy algorithm (on the CPU) that a :func:`d3rlpy_config` describes; in a d3rlpy
    child process only."""
    import d3rlpy
    from d3rlpy.models.encoders import VectorEncoderFactory

    encoders = {k: VectorEncoderFactory(hidden_units=v) for k, v in config["encoders"].items()}
    # Adam clipping gradient norms where emote's losses clip them (max_grad_norm).
    optimizers = {
        name: d3rlpy.optimizers.AdamFactory(clip_grad_norm=norm)
        for name, norm in config.get("clipped_optimizers", {}).items()
    }
    algo = getattr(d3rlpy.algos, config["class"])(**config["kwargs"], **encoders, **optimizers)
    return algo.create("cpu:0")


def d3rlpy_worker(request_file: str) -> None:
    """Trains and evaluates one d3rlpy algorithm as the request file says; prints
    ``{mean_return, seconds, threads, config}`` as one JSON line."""
    import gymnasium
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import d3rlpy

    request = json.loads(Path(request_file).read_text("utf-8"))
    d3rlpy.seed(request["seed"])
    arrays = np.load(request["transitions"])
    dataset = d3rlpy.dataset.MDPDataset(
        observations=arrays["observations"], actions=arrays["actions"],
        rewards=arrays["rewards"], terminals=arrays["terminals"], timeouts=arrays["timeouts"],
        action_space=d3rlpy.constants.ActionSpace.CONTINUOUS,
    )  # fmt: skip
    algo = d3rlpy_algorithm(request["config"])
    algo.build_with_dataset(dataset)
    updates = request["updates"]
    started = time.perf_counter()
    algo.fit(
        dataset, n_steps=updates, n_steps_per_epoch=updates, save_interval=updates + 1,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(), show_progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started

    env = gymnasium.make(request["env_id"], **request["env_kwargs"])
    low, high = env.action_space.low, env.action_space.high
    returns = []
    observation, _ = env.reset(seed=EVAL_SEED)
    for _ in range(request["episodes"]):
        total, done = 0.0, False
        while not done:
            action = algo.predict(observation[None].astype(np.float32))[0]
            action = low + (np.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
            observation, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        observation, _ = env.reset()
    answer = {"mean_return": float(np.mean(returns)), "seconds": seconds,
              "threads": torch.get_num_threads(),
              "config": json.loads(algo.config.serialize())}  # fmt: skip
    print(json.dumps(answer))


def worker_command(request: Path) -> list[str]:
    """The command of a child process that trains and evaluates what ``request`` says."""
    return [sys.executable, str(WORKER), str(request)]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python offline_d3rlpy.py REQUEST.json (with d3rlpy importable)")
    d3rlpy_worker(sys.argv[1])
