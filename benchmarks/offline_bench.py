"""Offline families side by side with d3rlpy: normalised score and updates/s on the datasets of
``benchmarks/offline_datasets.py``.

For each dataset x family (``bc``, ``iql``, ``cql``: those emote has registered) x seed it trains

- emote: ``emote train <family>_<env> --memory STORE --no-live --steps U --threads 1 --device cpu``,
  then ``emote eval RUN --json --episodes E`` (greedy); the score is the report's
  ``normalised_score``, else computed from the store's reference returns;
- d3rlpy 2.8.1 (``BCConfig``, ``IQLConfig``, ``CQLConfig``) in a child process, on an
  ``MDPDataset`` of the same transitions with the same batch size, hidden units, learning rates,
  discount, target rate and the family's own settings, for the same number of updates; its policy
  plays E greedy episodes of the same env (first reset seeded as ``emote eval`` seeds it);
- SAC from the same store (``emote train sac_<env> --memory STORE --no-live``), the path a user
  had before the offline families.

Both sides' settings are printed into the JSON (``--out``), and where the two libraries differ
the settings say how. Updates/s time only training: emote's ``train --json`` ``seconds``
(updates, plus one checkpoint and a one-episode evaluation at the end), d3rlpy's ``fit`` without
evaluators or logging. Both run one thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``);
with ``--jobs`` above 1 trainings share the machine, which the output says.

d3rlpy pins ``gymnasium==1.0.0`` and pulls ``gym``, so it is kept out of emote's environment:
install it into a folder of its own and pass that folder (``--d3rlpy-path``, or
``EMOTE_D3RLPY_PATH``); only the child processes put it on their ``PYTHONPATH``::

    pip install --target DIR --no-deps d3rlpy structlog dataclasses-json marshmallow \
        typing-inspect mypy-extensions scikit-learn scipy joblib threadpoolctl narwhals gym \
        cloudpickle gym-notices

    python benchmarks/offline_datasets.py --env pendulum --out datasets/pendulum
    python benchmarks/offline_bench.py --datasets datasets/pendulum --d3rlpy-path DIR \
        --out bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline_d3rlpy import (
    DIFFERENCES,
    ONE_THREAD,
    d3rlpy_config,
    run_d3rlpy_child,
    worker_command,
    write_transitions,
)

FAMILIES = ("bc", "iql", "cql")
"""The offline families compared, in table order."""
BASELINE = "sac"
"""The online family trained from the same stores."""
DATASETS = ("random", "medium", "medium_replay", "expert", "medium_expert")
D3RLPY_PATH_VARIABLE = "EMOTE_D3RLPY_PATH"


@dataclass(frozen=True)
class Job:
    """One training and evaluation: a library, a family, a dataset and a seed."""

    library: str  # "emote" or "d3rlpy"
    family: str
    dataset: str
    seed: int
    updates: int


@dataclass
class Result:
    job: Job
    score: float
    mean_return: float
    updates_per_second: float
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


# Settings: emote's recipe keys set on the command line (d3rlpy's: offline_d3rlpy.py).


def emote_overrides(family: str, recipe: dict[str, Any], batch_size: int) -> list[str]:
    """``--set`` values that make emote's run match the d3rlpy config
    :func:`offline_d3rlpy.d3rlpy_config` builds from the same recipe."""
    sets = [f"memory.batch_size={batch_size}", "eval.episodes=1", "eval.interval=0"]
    if family == "bc":  # d3rlpy's stochastic BC fits a sample, not a likelihood
        sets.append("bc.policy=deterministic")
    if family == "cql" and recipe.get("bc_warmup_updates"):  # d3rlpy's CQL has no warm-up
        sets.append("cql.bc_warmup_updates=0")
    return sets


# Running emote.


def emote_command() -> list[str]:
    script = Path(sys.executable).with_name("emote")
    return [str(script)] if script.exists() else [sys.executable, "-m", "emote_cli"]


def run_emote(*args: str, log: list[str]) -> dict[str, Any]:
    """Runs ``emote ARGS --json -q`` with one CPU thread and returns its JSON.

    Raises:
        RuntimeError: If it fails (exit 3, a missed ``min_return``, is not a failure).
    """
    log.append(shlex.join(["emote", *args]))
    result = subprocess.run(
        [*emote_command(), *args, "--json", "-q"], env=os.environ | ONE_THREAD,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode not in (0, 3):
        raise RuntimeError(f"`emote {shlex.join(args)}` failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def reference_scale(store: Path) -> tuple[float, float]:
    """``(random, expert)`` reference returns of a store.

    Raises:
        SystemExit: If the store records none.
    """
    from emote_core.stores.provenance import reference_returns

    recorded = reference_returns(store)
    if recorded is None:
        raise SystemExit(f"{store} records no reference returns; make it with offline_datasets.py")
    return recorded.random, recorded.expert


def emote_job(job: Job, args: argparse.Namespace, recipe: str, log: list[str]) -> Result:
    from emote_core.recipes import load_recipe

    store = args.datasets / f"{job.dataset}.zarr"
    run_dir = args.work / f"emote-{job.family}-{job.dataset}-s{job.seed}"
    table = _family_table(load_recipe(recipe), job.family)
    sets = [s for o in emote_overrides(job.family, table, args.batch_size) for s in ("--set", o)]
    trained = run_emote(
        "train", recipe, "--memory", str(store), "--no-live", "--steps", str(job.updates),
        "--threads", "1", "--device", "cpu", "--seed", str(job.seed), "--run-dir", str(run_dir),
        "--force", "--set", f"training.checkpoint_interval={job.updates}", *sets, log=log,
    )  # fmt: skip
    evaluated = run_emote(
        "eval", str(run_dir), "--episodes", str(args.eval_episodes), "--device", "cpu", log=log
    )
    mean_return = float(evaluated["mean_return"])
    score = evaluated.get("normalised_score")
    if score is None:
        random, expert = reference_scale(store)
        score = 100.0 * (mean_return - random) / (expert - random)
    seconds = float(trained["seconds"])
    return Result(job, float(score), mean_return, trained["updates"] / seconds, seconds)


def _family_table(recipe: Any, family: str) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(recipe.config) if family != BASELINE else {}


# Running d3rlpy (in a child process of offline_d3rlpy.py: emote's process never imports it).


def d3rlpy_job(job: Job, args: argparse.Namespace, spec: dict[str, Any], log: list[str]) -> Result:
    request = args.work / f"d3rlpy-{job.family}-{job.dataset}-s{job.seed}.json"
    request.write_text(json.dumps(spec | {"seed": job.seed, "updates": job.updates}), "utf-8")
    command = worker_command(request)
    log.append(shlex.join([f"PYTHONPATH={args.d3rlpy_path}", "python", *command[1:]]))
    answer = run_d3rlpy_child(command, args.d3rlpy_path, what=f"d3rlpy {job}")
    random, expert = reference_scale(args.datasets / f"{job.dataset}.zarr")
    score = 100.0 * (answer["mean_return"] - random) / (expert - random)
    seconds = answer["seconds"]
    extra = {"threads": answer["threads"], "config": answer["config"]}
    return Result(job, score, answer["mean_return"], job.updates / seconds, seconds, extra)


# The benchmark.


def registered_families() -> list[str]:
    from emote_core.algorithms.registry import algorithm_names

    names = set(algorithm_names())
    return [f for f in FAMILIES if f in names]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and sample standard deviation (0 for one value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(results: list[Result], datasets: Sequence[str]) -> list[dict[str, Any]]:
    """One row per dataset and family: both sides' scores (mean, std) and updates/s (mean)."""
    rows = []
    families = [*FAMILIES, BASELINE]
    for dataset in datasets:
        for family in families:
            sides = {}
            for library in ("emote", "d3rlpy"):
                mine = [r for r in results if (r.job.library, r.job.family, r.job.dataset)
                        == (library, family, dataset)]  # fmt: skip
                if mine:
                    score, std = mean_std([r.score for r in mine])
                    sides[library] = {
                        "score_mean": score, "score_std": std, "seeds": len(mine),
                        "updates": mine[0].job.updates,
                        "mean_return": statistics.fmean(r.mean_return for r in mine),
                        "updates_per_second": statistics.fmean(
                            r.updates_per_second for r in mine),
                        "scores": [r.score for r in mine],
                    }  # fmt: skip
            if not sides:
                continue
            ratio = z = None
            if "emote" in sides and "d3rlpy" in sides:
                ratio = sides["emote"]["updates_per_second"] / sides["d3rlpy"]["updates_per_second"]
                z = difference_z(sides["emote"]["scores"], sides["d3rlpy"]["scores"])
            rows.append({"dataset": dataset, "family": family, **sides, "speed_ratio": ratio,
                         "difference_z": z})  # fmt: skip
    return rows


def difference_z(mine: Sequence[float], theirs: Sequence[float]) -> float | None:
    """``(mean(mine) - mean(theirs))`` over the standard error of that difference (Welch's);
    ``|z| <= 2`` is within noise. ``None`` with fewer than two seeds a side or no spread."""
    if len(mine) < 2 or len(theirs) < 2:
        return None
    error = math.sqrt(
        statistics.variance(mine) / len(mine) + statistics.variance(theirs) / len(theirs)
    )
    return (statistics.fmean(mine) - statistics.fmean(theirs)) / error if error > 0 else None


def print_table(rows: list[dict[str, Any]], jobs: int) -> None:
    def score(side: dict[str, Any] | None) -> str:
        return f"{side['score_mean']:6.1f} ± {side['score_std']:5.1f}" if side else "-"

    def rate(side: dict[str, Any] | None) -> str:
        return f"{side['updates_per_second']:.0f}" if side else "-"

    print(f"{'dataset':<14} {'family':<6} {'updates':>7} {'emote score':>15} "
          f"{'d3rlpy score':>15} {'emote upd/s':>11} {'d3rlpy upd/s':>12} "
          f"{'ratio':>6} {'z':>5}")  # fmt: skip
    for row in rows:
        emote, d3 = row.get("emote"), row.get("d3rlpy")
        ratio = f"{row['speed_ratio']:.2f}" if row["speed_ratio"] else "-"
        z = f"{row['difference_z']:.1f}" if row.get("difference_z") is not None else "-"
        print(f"{row['dataset']:<14} {row['family']:<6} {(emote or d3)['updates']:>7} "
              f"{score(emote):>15} {score(d3):>15} {rate(emote):>11} {rate(d3):>12} "
              f"{ratio:>6} {z:>5}")  # fmt: skip
    print("scores: normalised (0 = random, 100 = expert), mean ± sample std over seeds; z: the "
          "score difference over its standard error, |z| <= 2 within noise")  # fmt: skip
    if jobs > 1:
        print(f"updates/s measured with --jobs {jobs}: {jobs} trainings shared the machine")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", type=Path, help="offline_datasets.py's --out folder.")
    parser.add_argument("--out", type=Path, help="Write the table and settings as JSON here.")
    parser.add_argument("--work", type=Path, help="Runs and d3rlpy inputs (DATASETS/bench).")
    parser.add_argument(
        "--families", default=None, help="Comma-separated (default: those of bc,iql,cql emote has)."
    )
    parser.add_argument("--only", default=None, help="Comma-separated datasets (default: all).")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=5_000, help="Updates of every training.")
    parser.add_argument("--family-updates", action="append", default=[], metavar="FAMILY=N",
                        help="Updates for one family (repeatable), e.g. cql=1000.")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="Trainings at once, one thread each.")
    parser.add_argument("--no-sac", action="store_true", help="Leave out SAC from the stores.")
    parser.add_argument("--no-d3rlpy", action="store_true", help="Train emote's side only.")
    parser.add_argument(
        "--d3rlpy-path", type=Path, default=os.environ.get(D3RLPY_PATH_VARIABLE),
        help=f"d3rlpy's install folder (default: ${D3RLPY_PATH_VARIABLE}).",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.datasets is None or not (args.datasets / "datasets.json").is_file():
        parser.error("--datasets must be a folder made by benchmarks/offline_datasets.py")
    if not args.no_d3rlpy and (args.d3rlpy_path is None or not args.d3rlpy_path.is_dir()):
        parser.error(f"pass --d3rlpy-path DIR (or set {D3RLPY_PATH_VARIABLE}), or --no-d3rlpy")
    for name in ("seeds", "updates", "batch_size", "eval_episodes", "jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.per_family = {k: int(v) for k, v in (s.split("=", 1) for s in args.family_updates)}
    except ValueError:
        parser.error(f"--family-updates takes FAMILY=N; got {args.family_updates}")
    args.work = args.work or args.datasets / "bench"
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    from emote_core.recipes import available_recipes, load_recipe

    made = json.loads((args.datasets / "datasets.json").read_text("utf-8"))
    env = made["env"]
    datasets = args.only.split(",") if args.only else list(DATASETS)
    families = args.families.split(",") if args.families else registered_families()
    recipes = {f: f"{f}_{env}" for f in families}
    if not args.no_sac:
        recipes[BASELINE] = made["recipe"]
    missing = [r for r in recipes.values() if r not in available_recipes()]
    if missing:
        raise SystemExit(f"no recipe {', '.join(missing)}; pass --families without them")
    args.work.mkdir(parents=True, exist_ok=True)

    settings: dict[str, Any] = {}
    specs: dict[tuple[str, str], dict[str, Any]] = {}
    first = load_recipe(recipes[families[0]] if families else made["recipe"])
    env_record = {"env_id": first.env.id, "env_kwargs": dict(first.env.kwargs)}
    transitions = {}
    for dataset in datasets:
        npz = args.work / f"{dataset}.npz"
        transitions[dataset] = write_transitions(args.datasets / f"{dataset}.zarr", npz)
    for family, recipe in recipes.items():
        table = _family_table(load_recipe(recipe), family)
        updates = args.per_family.get(family, args.updates)
        entry: dict[str, Any] = {
            "updates": updates,
            "emote": {"recipe": recipe, family: table,
                      "set": emote_overrides(family, table, args.batch_size)},
        }  # fmt: skip
        if family in FAMILIES and not args.no_d3rlpy:
            config = d3rlpy_config(family, table, args.batch_size)
            entry["d3rlpy"] = config
            entry["differences"] = DIFFERENCES[family]
            for dataset in datasets:
                specs[family, dataset] = env_record | {
                    "config": config, "episodes": args.eval_episodes,
                    "transitions": str((args.work / f"{dataset}.npz").absolute()),
                }  # fmt: skip
        settings[family] = entry

    jobs = []
    for dataset in datasets:
        for family in recipes:
            for seed in range(args.seeds):
                updates = settings[family]["updates"]
                jobs.append(Job("emote", family, dataset, seed, updates))
                if (family, dataset) in specs:
                    jobs.append(Job("d3rlpy", family, dataset, seed, updates))
    commands: list[str] = []

    def one(job: Job) -> Result:
        if job.library == "d3rlpy":
            result = d3rlpy_job(job, args, specs[job.family, job.dataset], commands)
        else:
            result = emote_job(job, args, recipes[job.family], commands)
        print(f"{job.library:<6} {job.family:<4} {job.dataset:<14} seed {job.seed}: score "
              f"{result.score:6.1f}, {result.updates_per_second:6.1f} updates/s",
              file=sys.stderr, flush=True)  # fmt: skip
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, jobs))
    rows = summarise(results, datasets)
    for result in results:  # every default d3rlpy filled in, as its config serialises itself
        if "config" in result.extra:
            settings[result.job.family]["d3rlpy_resolved"] = result.extra["config"]
    print_table(rows, args.jobs)
    if args.out:
        report = {
            "env": env, "datasets": str(args.datasets), "transitions": transitions,
            "reference_returns": made["reference_returns"], "seeds": args.seeds,
            "batch_size": args.batch_size, "eval_episodes": args.eval_episodes,
            "jobs": args.jobs, "shared_machine": args.jobs > 1, "settings": settings,
            "rows": rows, "commands": commands,
            "runs": [{"library": r.job.library, "family": r.job.family, "dataset": r.job.dataset,
                      "seed": r.job.seed, "score": r.score, "mean_return": r.mean_return,
                      "updates_per_second": r.updates_per_second, "seconds": r.seconds}
                     for r in results],
        }  # fmt: skip
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
