"""D4RL-style offline datasets, made with emote's own commands so that each store's provenance
records the command that made it.

For one environment (``--env``, mapped to its SAC recipe) it writes, under ``--out``:

- ``random.zarr``: ``--episodes`` episodes of uniformly random actions;
- ``expert.zarr``: the same number from a SAC run trained to the recipe's budget (``runs/expert``);
- ``medium.zarr``: from a second SAC run (same recipe and seed) stopped at the update count whose
  evaluation in the expert run scored nearest a third of the way from random to expert
  (normalised score ~33, D4RL's "medium"), read from the expert run's evaluations before its
  last (which is the expert itself);
- ``medium_replay.zarr``: every episode the medium run saw while training (its
  ``memory_export`` store, warm-up included), copied with ``emote memory convert``;
- ``medium_expert.zarr``: the medium episodes, then the expert episodes, in one store;
- ``datasets.json``: the commands run, each store's episodes, transitions and return
  min/median/max, the medium run's choice, and the reference returns.

Collection samples actions from the SAC policies (``emote collect --policy`` is stochastic), as
D4RL sampled from its SAC policies. The reference returns are the mean episode return of
``random.zarr`` (normalised score 0) and of ``expert.zarr`` (100); every store gets them
(``set_reference_returns``), so ``emote eval`` of a run trained on one reports its normalised
score. Training runs on the CPU with one thread (``OMP_NUM_THREADS=1``, ``--threads 1``).

    python benchmarks/offline_datasets.py --env pendulum --out datasets/pendulum --episodes 50

``--resume`` keeps the expert stage an interrupted call finished in ``--out`` (``random.zarr``,
``runs/expert``, ``expert.zarr``) and makes the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAC_RECIPES = {
    "pendulum": "sac_pendulum",
    "lunar_lander_continuous": "sac_lunar_lander",
    "hopper": "sac_hopper",
}
"""``--env`` -> the SAC recipe that makes its expert and medium policies."""
DATASETS = ("random", "medium", "medium_replay", "expert", "medium_expert")
"""Every dataset, by the name of its store (``<name>.zarr``)."""
MEDIUM_SCORE = 100.0 / 3.0
"""The normalised score of D4RL's "medium" policy: a third of the way from random to expert."""
EVALUATIONS_PER_RUN = 40
"""Evaluations (and checkpoints) of the expert run: the grid the medium update count is taken
from."""
EVAL_TAG = "eval_bp_step/mean_return"
"""The TensorBoard tag of the evaluations' mean return against updates."""


@dataclass(frozen=True)
class MediumChoice:
    """The update count the medium run stops at, and its evaluation in the expert run."""

    updates: int
    mean_return: float
    normalised_score: float


def normalised_score(mean_return: float, random: float, expert: float) -> float:
    """``100 * (mean_return - random) / (expert - random)`` (D4RL's normalised score).

    Raises:
        ValueError: If ``random == expert``.
    """
    if random == expert:
        raise ValueError(f"the random and expert returns are both {random}; they must differ")
    return 100.0 * (mean_return - random) / (expert - random)


def choose_medium(
    updates: Sequence[int],
    returns: Sequence[float],
    *,
    random: float,
    expert: float,
    target: float = MEDIUM_SCORE,
    before: int | None = None,
) -> MediumChoice:
    """The evaluation whose normalised score is nearest ``target`` (the earliest of equals),
    among those before ``before`` updates.

    Args:
        updates: The update count of each evaluation of the expert run.
        returns: Their mean returns.
        random: The random policy's mean return (score 0).
        expert: The expert's mean return (score 100).
        target: The normalised score sought.
        before: Only evaluations at fewer updates count (the expert run's budget: its last
            evaluation is of the expert policy itself, which a dip in a noisy evaluation can
            put nearest the target); ``None``: all.

    Raises:
        ValueError: If there is no evaluation (before ``before``), the two lists differ in
            length, or an update count is not positive.
    """
    if not updates or len(updates) != len(returns):
        raise ValueError(
            f"need one mean return per evaluation; got {len(updates)} update counts and "
            f"{len(returns)} returns"
        )
    if min(updates) < 1:
        raise ValueError(f"update counts must be positive; got {min(updates)}")
    scored = sorted(
        (abs(normalised_score(r, random, expert) - target), int(u), float(r))
        for u, r in zip(updates, returns, strict=True)
        if before is None or u < before
    )
    if not scored:
        raise ValueError(f"the expert run logged no evaluation before update {before}")
    _, chosen, mean_return = scored[0]
    return MediumChoice(chosen, mean_return, normalised_score(mean_return, random, expert))


def return_statistics(returns: Sequence[float]) -> dict[str, float]:
    """``{mean, min, median, max}`` of episode returns.

    Raises:
        ValueError: If there are none.
    """
    if not returns:
        raise ValueError("a dataset without episodes has no return statistics")
    return {
        "mean": statistics.fmean(returns),
        "min": min(returns),
        "median": statistics.median(returns),
        "max": max(returns),
    }


def emote_command() -> list[str]:
    """The ``emote`` script beside this Python (what a user types), else ``python -m emote_cli``."""
    script = Path(sys.executable).with_name("emote")
    return [str(script)] if script.exists() else [sys.executable, "-m", "emote_cli"]


class Commands:
    """Runs ``emote`` commands with one CPU thread, keeping each command line for the report."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.ran: list[dict[str, Any]] = []
        self.environment = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def __call__(self, *args: str) -> dict[str, Any]:
        command = [*emote_command(), *args, "--json", "-q"]
        shown = shlex.join(["emote", *args])
        print(f"$ {shown}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        result = subprocess.run(
            command, cwd=self.cwd, env=self.environment, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        self.ran.append({"command": shown, "seconds": round(seconds, 1)})
        if result.returncode != 0:
            raise SystemExit(f"`{shown}` failed ({result.returncode}): {result.stderr.strip()}")
        return json.loads(result.stdout)


def episode_returns(store: Path) -> list[float]:
    """The return of every committed episode of a store."""
    from emote_core.stores.zarr_store.reader import MemoryStore

    opened = MemoryStore(store)
    return [float(data[opened.length_key].sum()) for _, data, _ in opened.episodes()]


def dataset_summary(store: Path) -> dict[str, Any]:
    """Episodes, transitions, terminal episodes and return statistics of a store."""
    from emote_core.stores.zarr_store.reader import MemoryStore
    from emote_core.typing import EpisodeState

    opened = MemoryStore(store)
    returns, terminal = [], 0
    for _, data, state in opened.episodes():
        returns.append(float(data[opened.length_key].sum()))
        terminal += state == EpisodeState.TERMINAL
    return {
        "store": store.name,
        "episodes": len(returns),
        "transitions": opened.transition_count,
        "terminal_episodes": terminal,
        "return": return_statistics(returns),
    }


def evaluations(run_dir: Path) -> tuple[list[int], list[float]]:
    """The update count and mean return of every evaluation a run logged to TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = events.Scalars(EVAL_TAG)
    return [e.step for e in logged], [e.value for e in logged]


def sac_recipe(env: str) -> str:
    """The SAC recipe of ``--env``.

    Raises:
        SystemExit: If emote ships no such recipe (Hopper has none yet).
    """
    from emote_core.recipes import available_recipes

    recipe = SAC_RECIPES[env]
    if recipe not in available_recipes():
        raise SystemExit(
            f"--env {env} needs a SAC recipe '{recipe}' to train its expert and medium policies; "
            f"emote ships none — add recipes/{recipe}.toml (SAC tuned for that env) first"
        )
    return recipe


def make_datasets(args: argparse.Namespace) -> dict[str, Any]:
    """Runs every command and writes the stores, their reference returns and datasets.json."""
    from emote_core.recipes import load_recipe
    from emote_core.stores.provenance import set_reference_returns

    recipe = sac_recipe(args.env)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    budget = args.expert_steps or load_recipe(recipe).training.bp_steps
    if args.resume:
        check_expert_stage(out, budget)
    else:
        taken = [name for name in (*DATASETS, "runs") if (out / _store(name)).exists()]
        if taken:
            raise SystemExit(
                f"{out} already holds {', '.join(taken)}; pass an empty --out folder (or "
                "--resume one whose expert stage is done)"
            )
    interval = max(budget // EVALUATIONS_PER_RUN, 1)
    emote = Commands(out)
    n, seed = str(args.episodes), str(args.seed)
    training = ("--seed", seed, "--threads", "1", "--device", "cpu",
                "--set", f"training.checkpoint_interval={interval}",
                "--set", f"eval.interval={interval}")  # fmt: skip
    collect = ("--episodes", n, "--seed", seed, "--device", "cpu")

    if not args.resume:
        emote("collect", recipe, "--out", "random.zarr", *collect)
        emote("train", recipe, "--run-dir", "runs/expert", "--steps", str(budget), *training)
        emote("collect", recipe, "--policy", "runs/expert", "--out", "expert.zarr", *collect)
    random_return = statistics.fmean(episode_returns(out / "random.zarr"))
    expert_return = statistics.fmean(episode_returns(out / "expert.zarr"))

    updates, returns = evaluations(out / "runs" / "expert")
    medium = choose_medium(
        updates, returns, random=random_return, expert=expert_return, before=budget
    )
    # On --resume, runs/medium may hold an interrupted medium run: --force starts it over,
    # removing only the files that run recorded writing.
    again = ("--force",) if (out / "runs" / "medium").exists() else ()
    medium_run = emote("train", recipe, "--run-dir", "runs/medium", "--steps", str(medium.updates),
                       *training, "--set", "memory.store_episodes=true", *again)  # fmt: skip
    emote("collect", recipe, "--policy", "runs/medium", "--out", "medium.zarr", *collect)
    emote("memory", "convert", "runs/medium/memory_export", "medium_replay.zarr")
    emote("collect", recipe, "--policy", "runs/medium", "--out", "medium_expert.zarr", *collect)
    emote("collect", recipe, "--policy", "runs/expert", "--out", "medium_expert.zarr", *collect)

    source = (
        f"mean episode return of {args.episodes} random-policy episodes (random.zarr) and of "
        f"{args.episodes} episodes of a {budget}-update '{recipe}' policy (expert.zarr)"
    )
    for name in DATASETS:
        set_reference_returns(
            out / _store(name), random=random_return, expert=expert_return, source=source
        )
    report = {
        "env": args.env,
        "recipe": recipe,
        "seed": args.seed,
        "episodes_per_dataset": args.episodes,
        "collection": "sampled from each policy (emote collect), as D4RL did",
        "reference_returns": {"random": random_return, "expert": expert_return, "source": source},
        "expert_run": {"updates": budget, "last_evaluation": returns[-1]},
        "resumed": args.resume,
        "medium_run": {
            "updates": medium.updates,
            "expert_run_evaluation": {
                "mean_return": medium.mean_return,
                "normalised_score": medium.normalised_score,
            },
            "evaluation": medium_run.get("evaluation"),
            "target_normalised_score": MEDIUM_SCORE,
        },
        "datasets": {name: dataset_summary(out / _store(name)) for name in DATASETS},
        "commands": emote.ran,
    }
    (out / "datasets.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def check_expert_stage(out: Path, budget: int) -> None:
    """Checks that ``out`` holds a finished expert stage (``random.zarr``, ``runs/expert``
    evaluated at ``budget`` updates, ``expert.zarr``) and nothing after it.

    Raises:
        SystemExit: If it does not, saying what is missing or already there.
    """
    missing = [name for name in ("random.zarr", "runs/expert", "expert.zarr")
               if not (out / name).exists()]  # fmt: skip
    if missing:
        raise SystemExit(
            f"--resume needs a finished expert stage; {out} lacks {', '.join(missing)}"
        )
    later = [_store(name) for name in DATASETS if name not in ("random", "expert")]
    later = [name for name in (*later, "datasets.json") if (out / name).exists()]
    if later:
        raise SystemExit(f"{out} already holds {', '.join(later)}: its medium stage ran")
    updates, _ = evaluations(out / "runs" / "expert")
    if not updates or max(updates) != budget:
        reached = max(updates) if updates else 0
        raise SystemExit(
            f"{out / 'runs' / 'expert'} was last evaluated at {reached} updates, not at the "
            f"expert budget {budget} (--expert-steps)"
        )


def _store(name: str) -> str:
    return name if name == "runs" else f"{name}.zarr"


def print_summary(report: dict[str, Any]) -> None:
    references = report["reference_returns"]
    print(f"reference returns: random {references['random']:.1f}, "
          f"expert {references['expert']:.1f}")  # fmt: skip
    medium = report["medium_run"]
    print(f"medium run: {medium['updates']} updates (expert run's evaluation there "
          f"{medium['expert_run_evaluation']['mean_return']:.1f}, normalised "
          f"{medium['expert_run_evaluation']['normalised_score']:.1f})")  # fmt: skip
    print(f"{'dataset':<15} {'episodes':>8} {'transitions':>11} {'terminal':>8} "
          f"{'min':>9} {'median':>9} {'max':>9}")  # fmt: skip
    for name, summary in report["datasets"].items():
        ret = summary["return"]
        print(f"{name:<15} {summary['episodes']:>8} {summary['transitions']:>11} "
              f"{summary['terminal_episodes']:>8} {ret['min']:>9.1f} {ret['median']:>9.1f} "
              f"{ret['max']:>9.1f}")  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", choices=sorted(SAC_RECIPES), default="pendulum")
    parser.add_argument("--out", type=Path, required=True, help="An empty folder for the stores.")
    parser.add_argument("--episodes", type=int, default=50, help="Episodes per dataset.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of every run and collection.")
    parser.add_argument(
        "--expert-steps", type=int, default=None,
        help="Updates of the expert run (default: the SAC recipe's bp_steps).",
    )  # fmt: skip
    parser.add_argument(
        "--resume", action="store_true",
        help="Keep the expert stage (random.zarr, runs/expert, expert.zarr) an earlier call left "
        "in --out and make the rest.",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1; got {args.episodes}")
    if args.expert_steps is not None and args.expert_steps < 1:
        parser.error(f"--expert-steps must be at least 1; got {args.expert_steps}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    print_summary(make_datasets(parse_args(argv)))


if __name__ == "__main__":
    main()
