"""Does it learn? Trains shipped recipes with `emote train` and evaluates them with `emote eval`.

Each run goes through the CLI exactly as a user types it, into ``runs/bench-<recipe>``; the
figure printed is the mean deterministic return over the recipe's eval episodes, beside the
recipe's target and the rl-baselines3-zoo figure where one exists. Minutes per recipe on a CPU.

Run: ``python benchmarks/learning.py [NAME ...] [--seeds 0,1,2] [--jobs 2]``. A NAME is a
recipe (default: sac_hit_the_middle, sac_pendulum, dqn_cartpole; add sac_lunar_lander for about
an hour on a CPU, or on a GPU machine) or one of these comparisons, each over ``--seeds`` with
``--jobs`` runs at a time (one torch thread each), printing every seed's figure, the mean and
the spread (standard deviation over seeds):

- ``offline``: ``emote collect`` 50k random Pendulum steps, ``emote train --memory STORE
  --no-live``, the Q loss's trend read back from TensorBoard, and ``emote eval`` beside a random
  policy's return.
- ``hlgauss``: ``sac_hlgauss_pendulum`` beside ``sac_pendulum``, 20k env steps each.
- ``dqn_hlgauss``: ``dqn_hlgauss_cartpole`` beside ``dqn_cartpole`` (50k env steps), with the
  env step at which an interval eval first averaged 500.
- ``amp``: ``amp_pendulum`` on the style reward alone (``amp.task_reward_weight=0``), imitating
  a store of a trained ``sac_pendulum`` policy's episodes (``--expert RUN`` reuses a run), beside
  a random policy's and the expert's returns: the share of the gap between them it closes.
- ``symmetry``: ``sac_symmetry_lunar_lander`` beside the same recipe without the symmetry
  add-on, with each policy's symmetry error (``--steps N`` for a shorter budget).
- ``curl``: ``sac_curl_pixels`` (SAC with CURL on 48x48 pixel Pendulum) beside the same recipe
  without the curl add-on (``--set addons=[]``) and a random policy: interval eval returns at
  2k, 3k, 4k and 5k env steps, the final ``emote eval`` return, the margin over the random
  policy, CURL's last contrastive accuracy and the wall time (``--steps N`` updates per run;
  ``--report`` prints the tables from the runs as they stand).
- ``genrl``: a trained ``sac_pendulum`` policy (``--expert RUN`` reuses one) collects 50
  demonstration episodes and 10 held out; ``genrl_vae`` trains on the 50 (``--no-live``), its
  held-out reconstruction error is printed beside two baselines, then ``genrl_sac_pendulum``
  (SAC in its latent space) and ``sac_pendulum`` train over the same env steps (``--env-steps``,
  10,000 by default), evaluated every 250 env steps;
  ``--reuse`` keeps stores and runs that are already there.
- ``mbpo``: ``mbpo_pendulum`` beside ``sac_pendulum`` (20k env steps), both evaluated every 250
  env steps: eval returns at 2.5k, 5k, 10k and 20k env steps, wall time, the first env step an
  eval reached -200, and the model's held-out error. ``--env-steps N`` is MBPO's budget (5,000
  by default: the recipe's); ``--reuse`` keeps runs that already hold their final checkpoint
  (to extend a run: ``emote train --resume --run-dir runs/bench-mbpo_pendulum-s0 --steps U``);
  ``--report`` trains nothing and prints the tables from the runs as they stand, each as far as
  it got.
- ``mbpo_inverted_pendulum``: the same for ``mbpo_inverted_pendulum`` beside
  ``sac_inverted_pendulum`` on MuJoCo's InvertedPendulum-v5 (``pip install -e ".[mujoco]"``),
  with the first env step an eval reached the maximum return, 1000.
"""

from __future__ import annotations

import time
from pathlib import Path

from learning_representations import compare_curl, compare_genrl
from learning_runs import (  # benchmarks/ is on the path when this script runs
    EVAL_SEED,
    SeedRun,
    by_label,
    emote,
    latest_at_or_before,
    mean,
    random_policy_return,
    recipe_target,
    run_all,
    scalars,
    side_by_side,
    spread,
    wall_minutes,
)

ZOO = {
    "sac_pendulum": "-157 +- 89 at 20k steps",
    "dqn_cartpole": "500 at 50k steps",
    "sac_lunar_lander": "260 +- 65 at 500k steps",
}


OFFLINE_STEPS = 50_000
OFFLINE_UPDATES = 5_000


def offline(updates: int = OFFLINE_UPDATES) -> None:
    """Trains sac_pendulum from a store of random experience only and reports the Q loss trend."""
    import shutil

    root = Path("runs") / "bench-offline"
    shutil.rmtree(root, ignore_errors=True)
    store, run_dir = root / "random.zarr", root / "run"
    collected = emote("collect", "sac_pendulum", "--out", str(store), "--steps",
                      str(OFFLINE_STEPS), "--envs", "8")  # fmt: skip
    started = time.perf_counter()
    emote("train", "sac_pendulum", "--memory", str(store), "--no-live", "--steps", str(updates),
          "--run-dir", str(run_dir), "--set", "training.log_interval=10")  # fmt: skip
    seconds = time.perf_counter() - started
    report = emote("eval", str(run_dir))
    steps, losses = scalars(run_dir, "loss_bp_step/q1")
    _, targets = scalars(run_dir, "training_bp_step/q_target")
    # The values being fit grow as returns propagate (Q from ~-10 to ~-100 on Pendulum), so the
    # squared TD error is also shown relative to the squared mean target.
    relative = [loss / max(target**2, 1e-8) for loss, target in zip(losses, targets, strict=True)]
    tenth = max(len(losses) // 10, 1)
    lowest = min(range(len(losses)), key=losses.__getitem__)
    print(f"offline: {collected['transitions']} random transitions "
          f"({collected['env_steps_per_second']:.0f} env steps/s collecting), "
          f"{updates} updates in {seconds / 60:.1f} min")  # fmt: skip
    print(f"  Q1 loss (logged every 10 updates): {losses[0]:.3f} at update {steps[0]}, lowest "
          f"{losses[lowest]:.3f} at {steps[lowest]}, mean of the last tenth "
          f"{mean(losses[-tenth:]):.3f}")  # fmt: skip
    print(
        f"  Q1 loss / mean target^2: first tenth {mean(relative[:tenth]):.2e}, last tenth "
        f"{mean(relative[-tenth:]):.2e}; mean target {targets[0]:.1f} -> {targets[-1]:.1f}"
    )
    print(
        f"  eval: {report['mean_return']:.1f} +- {report['std_return']:.1f}; random policy "
        f"{random_policy_return(report['episodes']):.1f} (same {report['episodes']} seeds)"
    )


def main() -> None:
    import argparse
    from functools import partial

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="recipes or comparisons (see the module doc)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of comparisons")
    parser.add_argument("--jobs", type=int, default=2, help="comparison runs at a time")
    parser.add_argument("--steps", type=int,
                        help="updates per run of the symmetry and curl comparisons")  # fmt: skip
    parser.add_argument("--expert", help="a trained sac_pendulum run for the amp comparison")
    parser.add_argument("--env-steps", type=int,
                        help="env steps of mbpo (default 5,000) and genrl (10,000)")  # fmt: skip
    parser.add_argument("--reuse", action="store_true", help="keep finished runs (mbpo)")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: the mbpo and curl tables from the runs in runs/, "
                             "each as far as it got (runs extended with --resume "
                             "included)")  # fmt: skip
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    names = args.names or ["sac_hit_the_middle", "sac_pendulum", "dqn_cartpole"]
    comparisons = {
        "offline": lambda: offline(),
        "hlgauss": lambda: compare_hlgauss(seeds, args.jobs),
        "dqn_hlgauss": lambda: compare_dqn_hlgauss(seeds, args.jobs),
        "amp": lambda: compare_amp(seeds, args.jobs, expert=args.expert),
        "symmetry": lambda: compare_symmetry(seeds, args.jobs, steps=args.steps),
        "curl": lambda: compare_curl(seeds, args.jobs, steps=args.steps, report=args.report),
        "genrl": lambda: compare_genrl(seeds, args.jobs, expert=args.expert,
                                       env_steps=args.env_steps or 10_000, reuse=args.reuse),
        **{
            name: partial(compare_mbpo, seeds, args.jobs, pair=pair,
                          env_steps=args.env_steps or 5_000, reuse=args.reuse,
                          report=args.report)
            for name, pair in MBPO_PAIRS.items()
        },
    }  # fmt: skip
    recipes = [name for name in names if name not in comparisons]
    for name in names:
        if name in comparisons:
            comparisons[name]()
    rows = []
    for recipe in recipes:
        run_dir = Path("runs") / f"bench-{recipe}"
        started = time.perf_counter()
        trained = emote("train", recipe, "--run-dir", str(run_dir), "--force")
        seconds = time.perf_counter() - started
        report = emote("eval", str(run_dir))
        target = recipe_target(run_dir)
        rows.append((recipe, trained["steps"], seconds, report, target))
    if not rows:
        return
    print(f"{'recipe':<20}{'updates':>9}{'minutes':>9}{'mean return':>13}{'std':>8}"
          f"{'target':>9}  rl-baselines3-zoo")  # fmt: skip
    for recipe, steps, seconds, report, target in rows:
        mark = "" if target is None else (" ok" if report["mean_return"] >= target else " MISSED")
        print(f"{recipe:<20}{steps:>9}{seconds / 60:>9.1f}{report['mean_return']:>13.1f}"
              f"{report['std_return']:>8.1f}{target if target is not None else '-':>9}{mark}  "
              f"{ZOO.get(recipe, '-')}")  # fmt: skip


# -- comparisons over seeds ---------------------------------------------------------------


def compare_hlgauss(seeds: list[int], jobs: int) -> None:
    runs = run_all([SeedRun(label=recipe, recipe=recipe, seed=seed)
                    for recipe in ("sac_hlgauss_pendulum", "sac_pendulum")
                    for seed in seeds], jobs)  # fmt: skip
    groups = by_label(runs, lambda run: run.eval_return)
    side_by_side("HL-Gauss vs MSE critic, Pendulum-v1 at 20k env steps (eval return; target: "
                 "HL-Gauss mean >= MSE mean, both >= -200)", groups)  # fmt: skip


def compare_dqn_hlgauss(seeds: list[int], jobs: int) -> None:
    runs = run_all([SeedRun(label=recipe, recipe=recipe, seed=seed)
                    for recipe in ("dqn_hlgauss_cartpole", "dqn_cartpole")
                    for seed in seeds], jobs)  # fmt: skip
    side_by_side("HL-Gauss vs Huber DQN, CartPole-v1 at 50k env steps (final eval return)",
                 by_label(runs, lambda run: run.eval_return))  # fmt: skip
    print("  env step of the first interval eval averaging 500 (- : none):")
    for run in runs:
        steps, returns = scalars(run.run_dir, "eval_env_step/mean_return")
        first = next((step for step, value in zip(steps, returns, strict=True)
                      if value >= 500.0), None)  # fmt: skip
        print(f"    {run.label} seed {run.seed}: {first if first is not None else '-'}")


def compare_amp(seeds: list[int], jobs: int, *, expert: str | None) -> None:
    root = Path("runs") / "bench-amp"
    root.mkdir(parents=True, exist_ok=True)
    if expert is None:
        (trained,) = run_all([SeedRun(label="amp-expert", recipe="sac_pendulum", seed=0)], 1)
        expert = str(trained.run_dir)
    store = root / "expert.zarr"
    if store.exists():
        import shutil

        shutil.rmtree(store)
    emote("collect", "sac_pendulum", "--policy", expert, "--out", str(store),
          "--episodes", "20")  # fmt: skip
    expert_return = emote("eval", expert)["mean_return"]
    random_return = random_policy_return(emote("eval", expert)["episodes"])
    runs = run_all([SeedRun(label="amp_pendulum-style-only", recipe="amp_pendulum", seed=seed,
                            settings=("amp.task_reward_weight=0.0",
                                      f"amp.reference='{store}'"))
                    for seed in seeds], jobs)  # fmt: skip
    imitator = [run.eval_return for run in runs]
    closed = [(value - random_return) / (expert_return - random_return) for value in imitator]
    print("AMP on the style reward alone, Pendulum-v1 (eval task return; target: the imitator "
          "closes >= 0.5 of the random-to-expert gap)")  # fmt: skip
    print(f"  {'random policy':<34}{random_return:8.1f}")
    print(f"  {'expert (sac_pendulum, ' + expert + ')':<34}{expert_return:8.1f}")
    print(f"  {'imitator (amp_pendulum)':<34}{spread(imitator)}")
    print(f"  {'share of the gap closed':<34}{spread(closed, digits=3)}")


SYMMETRY_STATES = 1_000


def compare_symmetry(seeds: list[int], jobs: int, *, steps: int | None) -> None:
    recipe = "sac_symmetry_lunar_lander"
    runs = run_all([SeedRun(label=label, recipe=recipe, seed=seed, settings=settings,
                            steps=steps)
                    for label, settings in ((recipe, ()), ("no-symmetry-reward", (
                        "symmetry.confusion_reward_weight=0.0",)))
                    for seed in seeds], jobs)  # fmt: skip
    errors = {id(run): _symmetry_error(run, recipe) for run in runs}
    budget = f"{runs[0].updates} updates" + ("" if steps is None else " (a shortened budget)")
    print(f"Action symmetry, LunarLander-v3 continuous, {budget}; symmetry error = mean "
          f"|pi(mirror s) - mirror pi(s)| over {SYMMETRY_STATES} states of each policy's own "
          "episodes (target: >= 2x lower with the reward, at comparable return)")  # fmt: skip
    side_by_side("  eval return", by_label(runs, lambda run: run.eval_return))
    side_by_side("  symmetry error", by_label(runs, lambda run: errors[id(run)]), digits=3)


def _symmetry_error(run: SeedRun, recipe_name: str) -> float:
    """The exported policy's symmetry error over states of its own deterministic episodes."""
    import gymnasium as gym
    import numpy as np
    import onnxruntime

    from emote_core.algorithms.symmetry import MirrorMap, symmetry_error
    from emote_core.recipes import load_recipe

    onnx = run.run_dir / "policy.onnx"
    emote("export", "onnx", str(run.run_dir), "--out", str(onnx), "--force")
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    width = {i.name: i.shape[1] for i in session.get_inputs()}  # obs; epsilon: zeros, the mean

    def policy(states: np.ndarray) -> np.ndarray:
        feeds = {"obs": states.astype(np.float32)}
        if "epsilon" in width:
            feeds["epsilon"] = np.zeros((len(states), width["epsilon"]), np.float32)
        return session.run(["actions"], feeds)[0]

    recipe = load_recipe(recipe_name)
    config = recipe.section("symmetry")
    env = gym.make(recipe.env.id, **recipe.env.kwargs)
    states: list[np.ndarray] = []
    episode = 0
    while len(states) < SYMMETRY_STATES:
        state, _ = env.reset(seed=EVAL_SEED + episode)
        episode += 1
        done = False
        while not done and len(states) < SYMMETRY_STATES:
            states.append(state)
            action = policy(state[None])[0]
            state, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    env.close()
    return symmetry_error(
        policy, np.stack(states),
        observation_mirror=MirrorMap.build(permutation=config.observation_permutation,
                                           signs=config.observation_signs),
        action_mirror=MirrorMap.build(permutation=config.action_permutation,
                                      signs=config.action_signs),
    )  # fmt: skip


MBPO_MILESTONES = (2_500, 5_000, 10_000, 20_000)
MBPO_PAIRS = {  # comparison name: (the MBPO recipe, the SAC recipe beside it)
    "mbpo": ("mbpo_pendulum", "sac_pendulum"),
    "mbpo_inverted_pendulum": ("mbpo_inverted_pendulum", "sac_inverted_pendulum"),
}


def compare_mbpo(
    seeds: list[int],
    jobs: int,
    *,
    pair: tuple[str, str],
    env_steps: int,
    reuse: bool,
    report: bool = False,
) -> None:
    from emote_core.recipes import load_recipe

    mbpo_name, sac_name = pair
    mbpo, sac = load_recipe(mbpo_name), load_recipe(sac_name)
    warmup, ratio = mbpo.memory.warmup_steps, mbpo.training.bp_steps_per_inference
    updates = (env_steps - warmup) * ratio
    target = mbpo.eval.min_return
    runs = [SeedRun(label=recipe, recipe=recipe, seed=seed, steps=steps, reuse=reuse,
                    settings=settings)
            for recipe, steps, settings in (
                (mbpo_name, updates, ()),
                (sac_name, sac.training.bp_steps, ("eval.interval=250",)))
            for seed in seeds]  # fmt: skip
    if report:
        missing = [str(run.run_dir) for run in runs if not (run.run_dir / "tensorboard").is_dir()]
        if missing:
            raise SystemExit(f"--report: no run in {', '.join(missing)}; train them first")
    else:
        runs = run_all(runs, jobs)
    sac_env_steps = sac.memory.warmup_steps + sac.training.bp_steps
    budget = "as far as each run got ('-' past it)" if report else f"{env_steps} env steps"
    print(
        f"MBPO vs SAC, {mbpo.env.id}: mean eval return ({mbpo.eval.episodes} episodes) at the "
        f"latest interval eval at or before each env step; {mbpo_name} trained {budget} "
        f"({ratio} updates per env step), {sac_name} {sac_env_steps} env steps "
        f"(target: mbpo >= {target:g} within 5k)"
    )
    header = "".join(f"{f'{m // 1000:g}k' if m % 1000 == 0 else m:>10}" for m in MBPO_MILESTONES)
    print(f"  {'run':<34}{header}{'minutes':>9}{f'{target:g} at':>9}")
    curves: dict[str, list[list[float | None]]] = {}
    for run in sorted(runs, key=lambda run: (run.label, run.seed)):
        steps, returns = scalars(run.run_dir, "eval_env_step/mean_return")
        at = [latest_at_or_before(steps, returns, milestone) for milestone in MBPO_MILESTONES]
        curves.setdefault(run.label, []).append(at)
        first = next((s for s, v in zip(steps, returns, strict=True) if v >= target), None)
        cells = "".join(f"{v:>10.1f}" if v is not None else f"{'-':>10}" for v in at)
        print(f"  {run.label + ' seed ' + str(run.seed):<34}{cells}{wall_minutes(run):>9.1f}"
              f"{first if first is not None else '-':>9}")  # fmt: skip
    for label, rows in curves.items():
        means = []
        for column in zip(*rows, strict=True):
            values = [v for v in column if v is not None]
            means.append(f"{sum(values) / len(values):>10.1f}" if len(values) == len(column)
                         else f"{'-':>10}")  # fmt: skip
        print(f"  {label + ' mean':<34}{''.join(means)}")
    print("  model held-out normalised MSE (elites): last, and the env step it first fell "
          "below 0.05")  # fmt: skip
    for run in (run for run in runs if run.label == mbpo_name):
        steps, errors = scalars(run.run_dir, "model_bp_step/holdout_nmse")
        below = next((warmup + s // ratio for s, e in zip(steps, errors, strict=True)
                      if e < 0.05), None)  # fmt: skip
        print(f"    seed {run.seed}: {errors[-1]:.4f}, below 0.05 from env step "
              f"{below if below is not None else '-'}")  # fmt: skip


if __name__ == "__main__":
    main()
