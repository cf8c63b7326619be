"""SAC on a GPU: eager against ``training.compile``'s compiled and CUDA-graph updates, beside SB3.

Four sections, each printing its figures side by side in one run (``--sections`` picks some):

* ``updates``: the update loop alone (no env), SAC with 256x256 networks, batch 256, batches
  sampled from a table on the GPU (20k random Pendulum-v1 transitions), in updates/s for every
  ``training.compile`` mode (and CUDA graphs fed 16 batches per table sample), with the twin Q
  networks apart and stacked (``sac.stacked_q``), stacked with TensorFloat-32 matrix products
  (``torch.set_float32_matmul_precision("high")``: the products of a 256x256 update are small
  enough that their latency, not the GPU's arithmetic, counts), and Stable-Baselines3's
  ``SAC.train`` on the same GPU. Target: >= 5,000 updates/s.
* ``sampling``: transitions/s of batches of 256 one-step windows sampled from that GPU table,
  one batch per table sample and several (``memory.batches_per_sample``), beside a bare
  ``torch.randint`` + index gather of the same columns. Target: >= 10M transitions/s.
* ``pendulum``: ``sac_pendulum`` as ``emote train`` builds it (one env, one update per env step),
  in env steps/s between updates 1,500 and 4,500 (compilation and capture excluded), per mode.
  Targets: >= 1,500 env steps/s, and >= 6x eager.
* ``lunar``: ``emote train sac_lunar_lander --set training.compile=...``, the wall time from
  launch to the first evaluation with a mean return >= 200 (read from its TensorBoard events).

Run: ``python benchmarks/cuda_bench.py`` on a machine with CUDA (``nox -s bench`` skips it
without one). Random draws under ``compile`` differ from eager ones (same distributions).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import (
    BATCH,
    _synchronize,
    emote_sac,
    pendulum_episodes,
    sb3_sac,
    time_sb3,
)

from emote_core.callback import Callback, Order
from emote_core.callbacks.compiled import (
    COMPILE_MODES,
    compiled_training_callbacks,
    graph_counts,
)
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.logging import tag_for
from emote_core.memory.loaders import MemoryLoader
from emote_core.trainer import Trainer

DEVICE = torch.device("cuda")
UPDATE_TARGET, SAMPLING_TARGET, PENDULUM_TARGET, EAGER_MULTIPLE = 5_000, 10e6, 1_500, 6.0


def _updates(
    mode: str,
    batches_per_sample: int,
    episodes,
    env,
    updates: int,
    fused: bool = False,
    stacked_q: bool = False,
) -> float:
    """Updates/s of ``mode``; for compiled modes, also says how many graphs torch.compile made
    of the update callbacks' methods (SAC's five: the target and four losses, one each when
    nothing splits them) and how many graph breaks it met."""
    from torch._dynamo.utils import counters

    counters.clear()
    callbacks, loader = emote_sac(episodes, env, DEVICE, fused_adam=fused, stacked_q=stacked_q)
    loader = MemoryLoader(
        table=loader.table, rollout_count=BATCH, rollout_length=1,
        batches_per_sample=batches_per_sample,
    )  # fmt: skip
    running, _ = compiled_training_callbacks(callbacks, mode=mode, device=DEVICE)
    Trainer([*running, BackPropStepsTerminator(bp_steps=30)], loader).train()  # compile, capture
    _synchronize(DEVICE)
    if mode.startswith("compile"):
        graphs, breaks = graph_counts()
        adam = (", fused Adam" if fused else "") + (", stacked Q" if stacked_q else "")
        print(f"  ({mode}, {batches_per_sample} batches/sample{adam}: torch.compile made "
              f"{graphs} graphs, {breaks} graph breaks)")  # fmt: skip
    started = time.perf_counter()
    Trainer([*running, BackPropStepsTerminator(bp_steps=updates)], loader).train()
    _synchronize(DEVICE)
    return updates / (time.perf_counter() - started)


def section_updates(updates: int, quick: bool = False) -> None:
    episodes, env = pendulum_episodes(20_000)
    where = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "the CPU"
    print(f"SAC update loop alone on {where} (256x256, batch {BATCH}), "
          f"updates/s; target >= {UPDATE_TARGET}")  # fmt: skip
    recipes = "compile+cuda_graphs, 16 batches/sample, fused Adam"  # what the SAC recipes build
    rows: dict[str, tuple] = {mode: (mode, 1, False, False) for mode in COMPILE_MODES}
    rows |= {
        "compile+cuda_graphs, 16 batches/sample": ("compile+cuda_graphs", 16, False, False),
        recipes: ("compile+cuda_graphs", 16, True, False),
        "none, stacked Q": ("none", 1, False, True),
        f"{recipes}, stacked Q": ("compile+cuda_graphs", 16, True, True),  # sac.stacked_q
        f"{recipes}, stacked Q, TF32": ("compile+cuda_graphs", 16, True, True),
    }
    if quick:  # eager, and what the recipes build with the Q networks apart and stacked
        rows = {name: rows[name] for name in ("none", recipes, f"{recipes}, stacked Q",
                                              f"{recipes}, stacked Q, TF32")}  # fmt: skip
    rates: dict[str, float] = {}
    for name, (mode, per_sample, fused, stacked) in rows.items():
        with _matmul_precision("high" if name.endswith("TF32") else "highest"):
            rates[name] = _updates(
                mode, per_sample, episodes, env, updates, fused=fused, stacked_q=stacked
            )
    try:
        model = sb3_sac(episodes, env, DEVICE, fused_adam=False)
        time_sb3(model, 30, DEVICE)
        rates["Stable-Baselines3 SAC"] = time_sb3(model, updates, DEVICE)
    except ImportError:
        print("  (Stable-Baselines3 is not installed: pip install -e '.[bench]')")
    eager = rates["none"]
    for name, rate in rates.items():
        print(f"  {name:<70} {rate:8.0f} updates/s  ({rate / eager:4.1f}x eager)")
    best = max(v for k, v in rates.items() if "Stable" not in k)
    verdict = "met" if best >= UPDATE_TARGET else "MISSED"
    print(f"  best emote {best:.0f} updates/s: target {verdict}")


@contextmanager
def _matmul_precision(precision: str):
    """float32 matrix products at ``precision`` inside (``"high"``: TensorFloat-32 on the
    tensor cores of Ampere and newer GPUs, a 10-bit mantissa), torch's setting back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def section_sampling() -> None:
    episodes, env = pendulum_episodes(20_000)
    _, loader = emote_sac(episodes, env, DEVICE, fused_adam=False)
    table = loader.table
    print(f"sampling one-step windows from a GPU table of {table.size()} transitions, "
          f"transitions/s; target >= {SAMPLING_TARGET / 1e6:.0f}M")  # fmt: skip
    for per_sample in (1, 8, 64):
        sampler = MemoryLoader(
            table=table, rollout_count=BATCH, rollout_length=1, batches_per_sample=per_sample
        )
        batches = max(200, 40 * per_sample)
        for _ in range(2 * per_sample):
            sampler.sample()
        _synchronize(DEVICE)
        started = time.perf_counter()
        for _ in range(batches):
            sampler.sample()
        _synchronize(DEVICE)
        rate = batches * BATCH / (time.perf_counter() - started)
        print(f"  batches of {BATCH}, {per_sample:>2} per table sample: {rate / 1e6:6.2f}M/s")
    columns = [torch.randn(table.size(), width, device=DEVICE) for width in (3, 3, 1, 1, 1)]
    started = time.perf_counter()
    for _ in range(2_000):
        rows = torch.randint(0, table.size(), (BATCH,), device=DEVICE)
        for column in columns:
            column.index_select(0, rows)
    _synchronize(DEVICE)
    rate = 2_000 * BATCH / (time.perf_counter() - started)
    print(f"  bare torch.randint + 5 index_select per batch of {BATCH}:  {rate / 1e6:6.2f}M/s")


class Milestones(Callback):
    """Times the updates between two bp_steps (the device synchronised at both)."""

    order = Order.LOGGING

    def __init__(self, first: int, last: int) -> None:
        super().__init__(name="milestones")
        self.first, self.last, self.times = first, last, {}

    def end_batch(self, bp_step: int) -> None:
        if bp_step in (self.first, self.last):
            _synchronize(DEVICE)
            self.times[bp_step] = time.perf_counter()

    def rate(self) -> float:
        return (self.last - self.first) / (self.times[self.last] - self.times[self.first])


def _pendulum_rate(overrides: list[str], first: int, last: int) -> float:
    from emote_core.assembly.training import build_training
    from emote_core.recipes.loading import load_recipe
    from emote_core.runs import prepare_run

    recipe = load_recipe("sac_pendulum", overrides=["eval.interval=0", *overrides])
    with tempfile.TemporaryDirectory() as directory:
        run = prepare_run(
            Path(directory) / "run", recipe=recipe, command=["cuda_bench"], steps=last + 10
        )
        torch.manual_seed(recipe.seed)
        setup = build_training(recipe, run=run, device=DEVICE, bp_steps=last + 10,
                               terminal_log=False)  # fmt: skip
        milestones = Milestones(first, last)
        setup.trainer.callbacks.append(milestones)
        setup.trainer.train()
        if setup.env is not None:
            setup.env.close()
    return milestones.rate()


def section_pendulum(first: int, last: int, quick: bool = False) -> None:
    print(f"sac_pendulum as emote train builds it (1 env, 1 update per env step), env steps/s "
          f"over updates {first}-{last}; targets >= {PENDULUM_TARGET} and >= {EAGER_MULTIPLE:.0f}x "
          "eager")  # fmt: skip
    settings = {
        "eager": [],
        "cuda_graphs": ["training.compile=cuda_graphs"],
        "compile+cuda_graphs": ["training.compile=compile+cuda_graphs"],
        "compile+cuda_graphs, 16 batches/sample": [
            "training.compile=compile+cuda_graphs", "memory.batches_per_sample=16",
        ],
        "compile+cuda_graphs, 16 batches/sample, stacked Q": [
            "training.compile=compile+cuda_graphs", "memory.batches_per_sample=16",
            "sac.stacked_q=true",
        ],
    }  # fmt: skip
    if quick:
        settings = {name: settings[name] for name in ("eager", *list(settings)[-2:])}
    rates = {name: _pendulum_rate(overrides, first, last) for name, overrides in settings.items()}
    for name, rate in rates.items():
        print(f"  {name:<50} {rate:7.0f} env steps/s  ({rate / rates['eager']:4.1f}x eager)")


def _first_return_at_least(run_dir: Path, threshold: float) -> tuple[float | None, int | None]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tag = tag_for("eval/mean_return", "bp_step")
    if tag not in events.Tags()["scalars"]:
        return None, None
    for event in events.Scalars(tag):
        if event.value >= threshold:
            return event.wall_time, event.step
    return None, None


def section_lunar(mode: str, steps: int, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        run_dir = Path(directory) / "lunar"
        command = [
            sys.executable, "-m", "emote_cli", "train", "sac_lunar_lander", "--run-dir",
            str(run_dir), "--device", str(DEVICE), "--threads", "1", "--steps", str(steps),
            "--json", "-q", "--set", f"training.compile={mode}",
        ]  # fmt: skip
        for setting in extra:
            command += ["--set", setting]
        launched = time.time()
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
        if done.returncode != 0:
            print(f"  emote train failed ({done.returncode}): {done.stderr.strip()[-500:]}")
            return
        summary = json.loads(done.stdout)
        reached, step = _first_return_at_least(run_dir, 200.0)
        final = json.loads((run_dir / "eval.json").read_text())["mean_return"]
        print(f"sac_lunar_lander, training.compile={mode} {' '.join(extra)}: {steps} updates in "
              f"{summary['seconds']:.0f} s of training ({time.time() - launched:.0f} s from "
              f"launch); final eval {final:.1f}")  # fmt: skip
        if reached is None:
            print("  no evaluation reached a mean return of 200")
        else:
            print(f"  first evaluation >= 200 at update {step}, {reached - launched:.0f} s after "
                  "launch")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="updates,sampling,pendulum")
    parser.add_argument("--updates", type=int, default=3_000)
    parser.add_argument("--pendulum-updates", default="1500,4500", help="timed from,to")
    parser.add_argument("--lunar-steps", type=int, default=120_000)
    parser.add_argument("--lunar-mode", default="compile+cuda_graphs")
    parser.add_argument("--lunar-set", action="append", default=[])
    parser.add_argument("--device", default="cuda", help="cpu only to try the script out")
    parser.add_argument(
        "--quick", action="store_true",
        help="only eager and what the recipes build (compile+cuda_graphs, 16 batches per "
        "sample), with the Q networks apart and stacked: one device call's worth",
    )  # fmt: skip
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        print("cuda_bench: torch sees no CUDA device; nothing to measure here")
        return
    torch.set_num_threads(1)
    sections = args.sections.split(",")
    if "updates" in sections:
        section_updates(args.updates, args.quick)
    if "sampling" in sections:
        section_sampling()
    if "pendulum" in sections:
        first, last = (int(n) for n in args.pendulum_updates.split(","))
        section_pendulum(first, last, args.quick)
    if "lunar" in sections:
        section_lunar(args.lunar_mode, args.lunar_steps, args.lunar_set)


if __name__ == "__main__":
    main()
