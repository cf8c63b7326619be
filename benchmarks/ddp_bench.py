"""Data-parallel learners on the CPU: 1 rank against K ranks (gloo) of one recipe.

Each configuration is a real ``torchrun --standalone --nproc-per-node K`` launch of
``emote train RECIPE --no-live --memory STORE`` (training from a store, so collection does not
confound the figures) or, with ``--live``, of live training. Every rank uses ``--threads 1``.
Each rank runs the real command in-process (this file, re-entered with ``--rank-run``) and then
saves its final weights, so the driver can print the largest difference between ranks.

Printed per configuration: updates/s of one rank (``steps / seconds`` of rank 0's ``--json``
summary, which times the training loop, warm-up and checkpoints included), updates/s in all
(K times that: each rank's update takes its own batch), the scaling against one rank, and the
largest absolute difference of any weight between ranks (0.0 when they are identical).

Run: ``python benchmarks/ddp_bench.py --ranks 1 2 --steps 300`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _collect(recipe: str, store: Path, episodes: int) -> None:
    command = [sys.executable, "-m", "emote_cli", "collect", recipe, "--out", str(store)]
    command += ["--episodes", str(episodes), "--quiet"]
    subprocess.run(command, check=True, env=_env(), stdout=subprocess.DEVNULL)


def _launch(ranks: int, out: Path, train: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(ranks), __file__, "--rank-run", str(out), *train]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} ranks failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def _max_difference(out: Path, ranks: int) -> float:
    weights = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(ranks)]
    largest = 0.0
    for other in weights[1:]:
        for name, tensor in weights[0].items():
            largest = max(largest, (tensor - other[name]).abs().max().item())
    return largest


def drive(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ddp_bench_") as scratch:
        base = Path(scratch)
        train = ["train", args.recipe, "--steps", str(args.steps), "--threads", "1", "--json"]
        train += ["--set", f"memory.batch_size={args.batch_size}", "--set", "eval.episodes=1"]
        train += ["--set", f"training.checkpoint_interval={args.steps}"]
        if args.live:
            source = "live"
        else:
            store = base / "store.zarr"
            _collect(args.recipe, store, args.episodes)
            train += ["--no-live", "--memory", str(store)]
            source = f"store of {args.episodes} random episodes"
        print(f"{args.recipe}, {source}, {args.steps} updates of batch {args.batch_size}, CPU")
        print(f"{'ranks':>5} {'updates/s/rank':>15} {'updates/s all':>14} {'scaling':>8} "
              f"{'max |w_r - w_0|':>16}")  # fmt: skip
        single = None
        for ranks in args.ranks:
            out = base / f"ranks{ranks}"
            out.mkdir()
            summary = _launch(ranks, out, [*train, "--run-dir", str(base / f"run{ranks}")])
            per_rank = summary["steps"] / summary["seconds"]
            single = single or (per_rank if ranks == 1 else None)
            scaling = f"{per_rank * ranks / single:.2f}" if single else "-"
            print(f"{ranks:>5} {per_rank:>15.1f} {per_rank * ranks:>14.1f} {scaling:>8} "
                  f"{_max_difference(out, ranks):>16.3g}")  # fmt: skip


def rank_run(out: Path, argv: list[str]) -> None:
    """One rank: the real ``emote`` command, then this rank's final weights to ``out``."""
    import emote_core.assembly.training as training
    from emote_cli.app import main

    built: list[Any] = []
    build = training.build_training

    def keeping(*args: Any, **kwargs: Any) -> Any:
        built.append(build(*args, **kwargs))
        return built[-1]

    training.build_training = keeping
    sys.argv = ["emote", *argv]
    try:
        main()
    except SystemExit as exit_:
        if exit_.code:
            raise
    weights = {}
    for callback in built[0].trainer.callbacks:
        network = getattr(callback, "network", None)
        if isinstance(network, torch.nn.Module):
            for name, tensor in network.state_dict().items():
                weights[f"{callback.name}.{name}"] = tensor
        for k, parameter in enumerate(getattr(callback, "parameters", [])):
            weights[f"{callback.name}.optimised{k}"] = parameter.detach()
    torch.save(weights, out / f"rank{os.environ.get('RANK', '0')}.pt")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--rank-run":
        rank_run(Path(sys.argv[2]), sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="sac_pendulum")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300, help="updates per rank")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=10, help="episodes in the store")
    parser.add_argument("--live", action="store_true", help="collect while training")
    drive(parser.parse_args())


if __name__ == "__main__":
    main()
