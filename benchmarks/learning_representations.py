"""The learning comparisons of representations: CURL's pixel encoder (``sac_curl_pixels`` beside
the same recipe without the curl add-on) and GenRL's latent actions (``genrl_vae``, then
``genrl_sac_pendulum`` beside ``sac_pendulum``). ``benchmarks/learning.py curl|genrl`` runs
them; its docstring says what each prints."""

from __future__ import annotations

import time
from pathlib import Path

from learning_runs import (  # benchmarks/ is on the path when this script runs
    SeedRun,
    by_label,
    emote,
    eval_cells,
    random_policy_return,
    run_all,
    scalars_or_none,
    side_by_side,
    wall_minutes,
)

CURL_MILESTONES = (2_000, 3_000, 4_000, 5_000)
CURL_LABELS = {"sac_curl_pixels": (), "sac_pixels-no_curl": ("addons=[]",)}


def compare_curl(seeds: list[int], jobs: int, *, steps: int | None, report: bool) -> None:
    from emote_core.recipes import load_recipe

    recipe = load_recipe("sac_curl_pixels")
    runs = [SeedRun(label=label, recipe="sac_curl_pixels", seed=seed, settings=settings,
                    steps=steps)
            for label, settings in CURL_LABELS.items() for seed in seeds]  # fmt: skip
    if report:
        for run in runs:
            if not (run.run_dir / "tensorboard").is_dir():
                raise SystemExit(f"--report: no run in {run.run_dir}; train it first")
            evaluated = emote("eval", str(run.run_dir))
            run.eval_return = evaluated["mean_return"]
            run.updates = int(Path(evaluated["checkpoint"]).stem.rpartition("_")[2])
    else:
        runs = run_all(runs, jobs)
    random_return = random_policy_return(recipe.eval.episodes, "sac_curl_pixels")
    env_steps = recipe.memory.warmup_steps + (steps or recipe.training.bp_steps)
    budget = "as far as each run got" if report else f"{env_steps} env steps"
    print(
        f"SAC from pixels with and without CURL, {recipe.env.id} (48x48 grey, 3 frames), "
        f"{budget}: mean eval return ({recipe.eval.episodes} episodes) at the latest interval "
        f"eval at or before each env step ('-': not reached), then emote eval on the last "
        f"checkpoint (after 'updates' updates, one per env step after "
        f"{recipe.memory.warmup_steps} random steps)"
    )
    header = "".join(f"{m / 1000:>9g}k" for m in CURL_MILESTONES)
    print(f"  {'run':<34}{header}{'final':>10}{'updates':>9}{'minutes':>9}{'curl acc':>9}")
    for run in sorted(runs, key=lambda run: (run.label, run.seed)):
        cells, _, _ = eval_cells(run, CURL_MILESTONES)
        accuracy = "-"
        if run.label == "sac_curl_pixels":
            accuracies = scalars_or_none(run.run_dir, "training_bp_step/curl_accuracy")[1]
            accuracy = f"{accuracies[-1]:.2f}" if accuracies else "-"
        print(f"  {run.label + ' seed ' + str(run.seed):<34}{cells}{run.eval_return:>10.1f}"
              f"{run.updates:>9}{wall_minutes(run):>9.1f}{accuracy:>9}")  # fmt: skip
    groups = by_label(runs, lambda run: run.eval_return)
    side_by_side(f"final eval return (random policy: {random_return:.1f})", groups)
    for label, values in groups.items():
        margin = sum(values) / len(values) - random_return
        print(f"  {label}: {margin:+.1f} over the random policy")


GENRL_MILESTONES = (2_500, 5_000, 10_000)


def compare_genrl(
    seeds: list[int], jobs: int, *, expert: str | None, env_steps: int, reuse: bool
) -> None:
    """Demonstrations of a trained sac_pendulum policy -> genrl_vae -> genrl_sac_pendulum, beside
    sac_pendulum, both over ``env_steps``."""
    root = Path("runs") / "bench-genrl"
    root.mkdir(parents=True, exist_ok=True)
    if expert is None:
        (trained,) = run_all([SeedRun(label="genrl-expert", recipe="sac_pendulum", seed=0)], 1)
        expert = str(trained.run_dir)
    stores = {"demos": (root / "demos.zarr", 50, 1), "held_out": (root / "held_out.zarr", 10, 2)}
    for store, episodes, seed in stores.values():
        if not (reuse and store.exists()):
            if store.exists():
                import shutil

                shutil.rmtree(store)
            emote("collect", "sac_pendulum", "--policy", expert, "--out", str(store),
                  "--episodes", str(episodes), "--seed", str(seed))  # fmt: skip
    vae = SeedRun(label="genrl_vae", recipe="genrl_vae", seed=0, reuse=reuse, steps=10_000)
    if not (reuse and vae.finished()):
        started = time.perf_counter()
        emote("train", "genrl_vae", "--memory", str(stores["demos"][0]), "--no-live",
              "--run-dir", str(vae.run_dir), "--force", "--threads", "1")  # fmt: skip
        vae.minutes = (time.perf_counter() - started) / 60
    errors = _held_out_reconstruction(vae.run_dir, stores["held_out"][0])
    prior = emote("eval", str(vae.run_dir))["mean_return"]
    expert_return = emote("eval", expert)["mean_return"]
    from emote_core.recipes import load_recipe

    sac = load_recipe("sac_pendulum")
    updates = env_steps - sac.memory.warmup_steps
    runs = [SeedRun(label=label, recipe=label, seed=seed, steps=updates, reuse=reuse,
                    settings=settings)
            for label, settings in (
                ("genrl_sac_pendulum", (f"genrl_sac.vae_run='{vae.run_dir}'",
                                        "eval.interval=250")),
                ("sac_pendulum", ("eval.interval=250",)))
            for seed in seeds]  # fmt: skip
    runs = run_all(runs, jobs)
    print(f"GenRL on Pendulum-v1: demonstrations of {expert} (eval return "
          f"{expert_return:.1f}), {stores['demos'][1]} episodes to train the VAE, "
          f"{stores['held_out'][1]} held out")  # fmt: skip
    print(f"  held-out reconstruction: MSE {errors['vae']:.5f} (encoder mean, decoded); "
          f"{errors['prior']:.5f} decoding the prior's mean; {errors['mean_action']:.5f} "
          f"predicting the mean action; actions' variance {errors['variance']:.5f}")  # fmt: skip
    print(f"  the VAE run's own policy (the prior's mean decoded): eval return {prior:.1f}")
    header = "".join(f"{f'{m / 1000:g}k':>10}" for m in GENRL_MILESTONES)
    print(f"  {'run':<34}{header}{'final':>10}{'minutes':>9}{'-200 at':>9}")
    for run in sorted(runs, key=lambda run: (run.label, run.seed)):
        cells, logged, returns = eval_cells(run, GENRL_MILESTONES)
        first = next((s for s, v in zip(logged, returns, strict=True) if v >= -200.0), None)
        print(f"  {run.label + ' seed ' + str(run.seed):<34}{cells}{run.eval_return:>10.1f}"
              f"{wall_minutes(run):>9.1f}{first if first is not None else '-':>9}")  # fmt: skip
    finals = by_label(runs, lambda run: run.eval_return)
    side_by_side(f"final eval return at {env_steps} env steps", finals)


def _held_out_reconstruction(vae_run: Path, held_out: Path) -> dict[str, float]:
    """Mean squared errors on the held-out demonstrations' actions: the VAE's reconstruction
    (encoder mean, decoded), decoding the prior's mean, and the mean action."""
    import numpy as np
    import torch

    from emote_core.algorithms.genrl import read_vae_run
    from emote_core.assembly.builders import make_env
    from emote_core.nn.inputs import flatten_observation
    from emote_core.recipes import load_recipe
    from emote_core.stores.zarr_store import MemoryStore

    env = make_env(load_recipe("genrl_vae"), num_envs=1)
    vae = read_vae_run(str(vae_run), env.spaces, torch.device("cpu")).eval()
    keys = list(env.spaces.state.keys())
    env.close()
    observations, actions = [], []
    for _, columns, _ in MemoryStore(held_out).episodes():
        steps = len(columns["actions"])
        observations.append(flatten_observation(
            {k: torch.as_tensor(columns[k][:steps]) for k in keys}))  # fmt: skip
        actions.append(torch.as_tensor(columns["actions"], dtype=torch.float32))
    obs, act = torch.cat(observations), torch.cat(actions)
    with torch.no_grad():
        mean, _ = vae.encode(act, obs)
        reconstructed = vae.decode(mean, obs)
        prior = vae.decode(torch.zeros_like(mean), obs)
    return {
        "vae": float((reconstructed - act).square().mean()),
        "prior": float((prior - act).square().mean()),
        "mean_action": float((act - act.mean(0)).square().mean()),
        "variance": float(np.var(act.numpy())),
    }
