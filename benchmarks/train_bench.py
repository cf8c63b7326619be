"""SAC training throughput: emote's callbacks through the Trainer against a hand-written SAC
update loop and Stable-Baselines3 SAC.

All sides train on the same 20k random Pendulum-v1 transitions (observation 3, action 1) with the
same settings: policy and twin Q networks of 256x256, batch 256, Adam at 3e-4, learned entropy
temperature, Polyak tau 0.005, one target update per step, no gradient clipping (SB3's SAC has
none; emote's losses get ``max_grad_norm=None``).

* emote: ``QTarget``, two ``QLoss``, ``PolicyLoss`` and ``AlphaLoss`` run by the ``Trainer``, fed
  by a ``MemoryLoader`` over a filled ``DictObsMemoryTable`` (sampling included in the time).
* hand-written: the same math in a plain torch loop over the same networks (emote's
  ``GaussianMlpPolicy`` and ``ActionValueMlp``) and the same Adam: indices drawn with numpy from
  flat arrays of the same transitions, twin Q, policy and temperature losses, ``lerp_`` Polyak
  updates; no Trainer, no callbacks, no logging, no gradient-norm measurement. The engine's own
  overhead is the gap between emote and this loop (the target: emote >= 0.95x of it).
* SB3: ``SAC.train(gradient_steps=N, batch_size=256)`` on a filled replay buffer (its sampling
  included too).

The figure is updates (gradient steps) per second. Measurements alternate between the sides in
short blocks, in A-B-B-A order (the machine's speed drifts over seconds on a shared host); each
side's rate is the median of ``--repeats`` blocks, and each ratio the median of the blocks'
ratios (the two sides timed back to back).

Run: ``python benchmarks/train_bench.py`` (``--device cuda`` on a GPU machine). CPU runs use one
torch thread.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from emote_core.algorithms.sac import AlphaLoss, PolicyLoss, QLoss, QTarget, StackedQLoss
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.nn.action_value import ActionValueMlp, StackedActionValueMlp
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.spaces import MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState

HIDDEN = (256, 256)
BATCH = 256
LR = 3e-4


@dataclass
class Episode:
    observations: np.ndarray  # (N + 1, 3)
    actions: np.ndarray  # (N, 1), scaled to [-1, 1] as both libraries store them
    rewards: np.ndarray  # (N,)
    end_state: EpisodeState


def pendulum_episodes(transitions: int, seed: int = 0) -> tuple[list[Episode], gym.Env]:
    """Random-policy Pendulum-v1 episodes holding ``transitions`` transitions in all."""
    env = gym.make("Pendulum-v1")
    env.action_space.seed(seed)
    high = env.action_space.high
    episodes: list[Episode] = []
    total = 0
    while total < transitions:
        observation, _ = env.reset(seed=seed + len(episodes))
        observations, actions, rewards = [observation], [], []
        terminated = truncated = False
        while not (terminated or truncated):
            action = env.action_space.sample()
            observation, reward, terminated, truncated, _ = env.step(action)
            observations.append(observation)
            actions.append(action / high)
            rewards.append(reward)
        state = EpisodeState.from_gymnasium(terminated=terminated, truncated=truncated)
        episodes.append(
            Episode(
                np.asarray(observations, np.float32), np.asarray(actions, np.float32),
                np.asarray(rewards, np.float32), state,
            )
        )  # fmt: skip
        total += len(actions)
    return episodes, env


def emote_sac(
    episodes: list[Episode],
    env: gym.Env,
    device: torch.device,
    fused_adam: bool,
    stacked_q: bool = False,
):
    """The emote callbacks and a loader over a table holding ``episodes``; with ``stacked_q``,
    the twin Q networks stacked in one module (``sac.stacked_q``), from the same weights."""
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    table = DictObsMemoryTable(spaces=spaces, maxlen=10**6, device=device, seed=0)
    for identity, episode in enumerate(episodes):
        table.add_sequence(
            identity,
            {"obs": episode.observations, "actions": episode.actions, "rewards": episode.rewards},
            end_state=episode.end_state,
        )
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    q1 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    q2 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    ln_alpha = torch.zeros(1, device=device, requires_grad=True)
    options = {"fused": True} if fused_adam else {}

    def adam(parameters) -> torch.optim.Adam:
        return torch.optim.Adam(parameters, lr=LR, **options)

    clip = {"max_grad_norm": None}  # SB3's SAC does not clip gradients
    if stacked_q:
        critics = StackedActionValueMlp.from_networks([q1, q2])
        networks: dict = {"critics": critics}
        targets: dict = {"critics_target": copy.deepcopy(critics)}
        q_losses = [StackedQLoss(critics=critics, optimizer=adam(critics.parameters()), **clip)]
    else:
        networks, targets = (
            {"q1": q1, "q2": q2},
            {"q1_target": copy.deepcopy(q1), "q2_target": copy.deepcopy(q2)},
        )
        q_losses = [QLoss(name=name, q=q, optimizer=adam(q.parameters()), **clip)
                    for name, q in networks.items()]  # fmt: skip
    callbacks = [
        QTarget(policy=policy, ln_alpha=ln_alpha, **networks, **targets),
        *q_losses,
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, **networks,
                   optimizer=adam(policy.parameters()), **clip),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=1, optimizer=adam([ln_alpha]),
                  **clip),
    ]  # fmt: skip
    loader = MemoryLoader(table=table, rollout_count=BATCH, rollout_length=1)
    return callbacks, loader


@dataclass
class HandSac:
    """The state of the hand-written SAC loop: flat transition arrays, networks, optimisers."""

    arrays: dict[str, np.ndarray]
    policy: GaussianMlpPolicy
    q1: ActionValueMlp
    q2: ActionValueMlp
    q1_target: ActionValueMlp
    q2_target: ActionValueMlp
    ln_alpha: torch.Tensor
    optimizers: tuple[torch.optim.Adam, ...]
    rng: np.random.Generator


def hand_sac(episodes: list[Episode], device: torch.device, fused_adam: bool) -> HandSac:
    """Flat ``(N, ...)`` arrays of ``episodes``' transitions and freshly seeded networks, built as
    :func:`emote_sac` builds its own."""
    arrays = {
        "obs": np.concatenate([e.observations[:-1] for e in episodes]),
        "next_obs": np.concatenate([e.observations[1:] for e in episodes]),
        "actions": np.concatenate([e.actions for e in episodes]),
        "rewards": np.concatenate([e.rewards for e in episodes])[:, None],
        "masks": np.concatenate([
            np.r_[np.ones(len(e.rewards) - 1), 0.0 if e.end_state == EpisodeState.TERMINAL else 1.0]
            for e in episodes
        ]).astype(np.float32)[:, None],
    }  # fmt: skip
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    q1 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    q2 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN).to(device)
    q1_target, q2_target = copy.deepcopy(q1), copy.deepcopy(q2)
    q1_target.requires_grad_(False)
    q2_target.requires_grad_(False)
    ln_alpha = torch.zeros(1, device=device, requires_grad=True)
    options = {"fused": True} if fused_adam else {}
    optimizers = tuple(
        torch.optim.Adam(parameters, lr=LR, **options)
        for parameters in (q1.parameters(), q2.parameters(), policy.parameters(), [ln_alpha])
    )
    return HandSac(arrays, policy, q1, q2, q1_target, q2_target, ln_alpha, optimizers,
                   np.random.default_rng(0))  # fmt: skip


def time_hand(sac: HandSac, updates: int, device: torch.device) -> float:
    """Updates per second of ``updates`` steps of the hand-written loop: the same math as
    emote's QTarget, QLoss x2, PolicyLoss and AlphaLoss (gamma 0.99, tau 0.005, target entropy
    -1, alpha at most 10)."""
    arrays, policy, q1, q2 = sac.arrays, sac.policy, sac.q1, sac.q2
    q1_optimizer, q2_optimizer, policy_optimizer, alpha_optimizer = sac.optimizers
    policy_parameters = list(policy.parameters())
    pairs = [*zip(sac.q1_target.parameters(), q1.parameters(), strict=True),
             *zip(sac.q2_target.parameters(), q2.parameters(), strict=True)]  # fmt: skip
    ln_alpha, gamma, tau, max_ln_alpha = sac.ln_alpha, 0.99, 0.005, float(np.log(10.0))
    size = len(arrays["rewards"])
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(updates):
        rows = sac.rng.integers(0, size, BATCH)
        obs, next_obs, actions, rewards, masks = (
            _to_device(arrays[key][rows], device)
            for key in ("obs", "next_obs", "actions", "rewards", "masks")
        )
        with torch.no_grad():
            next_actions, next_log_probs = policy.sample(next_obs)
            q_next = torch.min(
                sac.q1_target(observation=next_obs, actions=next_actions),
                sac.q2_target(observation=next_obs, actions=next_actions),
            )
            q_target = rewards + gamma * masks * (q_next - ln_alpha.exp() * next_log_probs)
        for q, optimizer in ((q1, q1_optimizer), (q2, q2_optimizer)):
            optimizer.zero_grad(set_to_none=True)
            (q(observation=obs, actions=actions) - q_target).square().mean().backward()
            optimizer.step()
        policy_optimizer.zero_grad(set_to_none=True)
        new_actions, log_probs = policy.sample(obs)
        q_values = torch.min(q1(observation=obs, actions=new_actions),
                             q2(observation=obs, actions=new_actions))  # fmt: skip
        policy_loss = (ln_alpha.detach().exp() * log_probs - q_values).mean()
        policy_loss.backward(inputs=policy_parameters)  # no weight gradients for the Q networks
        policy_optimizer.step()
        alpha_optimizer.zero_grad(set_to_none=True)
        (-(ln_alpha * (log_probs.detach() - 1.0)).mean()).backward()
        alpha_optimizer.step()
        with torch.no_grad():
            ln_alpha.clamp_(max=max_ln_alpha)
            for target, source in pairs:
                target.lerp_(source, tau)
    _synchronize(device)
    return updates / (time.perf_counter() - start)


def time_emote(callbacks, loader, updates: int, device: torch.device) -> float:
    """Updates per second of ``updates`` steps through a fresh Trainer."""
    trainer = Trainer([*callbacks, BackPropStepsTerminator(bp_steps=updates)], loader)
    _synchronize(device)
    start = time.perf_counter()
    trainer.train()
    _synchronize(device)
    return updates / (time.perf_counter() - start)


def sb3_sac(episodes: list[Episode], env: gym.Env, device: torch.device, fused_adam: bool):
    """An SB3 SAC model whose replay buffer holds ``episodes``."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import Logger

    policy_kwargs: dict = {"net_arch": list(HIDDEN)}
    if fused_adam:
        policy_kwargs["optimizer_kwargs"] = {"fused": True}
    model = SAC(
        "MlpPolicy", env, learning_rate=LR, buffer_size=10**6, batch_size=BATCH,
        policy_kwargs=policy_kwargs, device=device, seed=0,
    )  # fmt: skip
    model.set_logger(Logger(folder=None, output_formats=[]))
    for episode in episodes:
        last = len(episode.actions) - 1
        for t in range(len(episode.actions)):
            done = t == last and episode.end_state == EpisodeState.TERMINAL
            model.replay_buffer.add(
                episode.observations[t : t + 1], episode.observations[t + 1 : t + 2],
                episode.actions[t : t + 1], episode.rewards[t : t + 1], np.array([done]), [{}],
            )  # fmt: skip
    return model


def time_sb3(model, updates: int, device: torch.device) -> float:
    """Updates per second of ``model.train(gradient_steps=updates)``."""
    _synchronize(device)
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=BATCH)
    _synchronize(device)
    return updates / (time.perf_counter() - start)


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch array on ``device``; to CUDA through pinned memory, without a stream sync."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collection_rates(
    env_id: str, num_envs: int, vector_steps: int, repeats: int = 3
) -> dict[str, tuple[float, float]]:
    """Env steps/s of a random policy (``collect_bench.py`` measures these and more), each with
    its ratio to bare vector-env stepping (pre-drawn actions): a floor for any per-step
    collector (actions drawn and every step written into per-env numpy buffers, no episodes, no
    store); ``emote collect`` into a Zarr store (its own figure, from a subprocess); and the
    training path (GymCollector, MemoryTableProxy, store appends). Each figure runs ``repeats``
    times right after a bare run: the rate is the median, the ratio the median of the pairs'
    ratios."""
    import tempfile

    from collect_bench import bare_rate, cli_rate, floor_rate, paired, training_path_rate

    with tempfile.TemporaryDirectory() as directory:
        measures = {
            "floor": lambda: floor_rate(env_id, num_envs, vector_steps),
            "collect": lambda: cli_rate(env_id, num_envs, vector_steps * num_envs, directory),
            "training": lambda: training_path_rate(env_id, num_envs, vector_steps, directory),
        }
        bare: list[float] = []
        figures: dict[str, tuple[float, float]] = {}
        for name, measure in measures.items():
            reference, rate, ratio, _ = paired(
                repeats,
                lambda: bare_rate(env_id, num_envs, vector_steps),
                lambda measure=measure: (measure(), 0.0),  # no final commit to report
            )
            bare.append(reference)
            figures[name] = (rate, ratio)
        return {"bare": (statistics.median(bare), 1.0), **figures}


def stacked_rates(
    episodes: list[Episode], env: gym.Env, updates: int, repeats: int
) -> dict[int, tuple[float, float, float]]:
    """Per CPU thread count (1 and 2): emote's SAC updates/s with twin Q networks and with them
    stacked (``sac.stacked_q``), timed in turns, and the median of the pairs' ratios."""
    device = torch.device("cpu")
    figures = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        twin = emote_sac(episodes, env, device, False)
        stacked = emote_sac(episodes, env, device, False, stacked_q=True)
        time_emote(*twin, updates // 2, device)
        time_emote(*stacked, updates // 2, device)
        twin_runs: list[float] = []
        stacked_runs: list[float] = []
        for repeat in range(repeats):
            sides = [(twin, twin_runs), (stacked, stacked_runs)]
            for parts, rates in sides if repeat % 2 == 0 else sides[::-1]:
                rates.append(time_emote(*parts, updates, device))
        ratio = statistics.median(s / t for t, s in zip(twin_runs, stacked_runs, strict=True))
        figures[threads] = (statistics.median(twin_runs), statistics.median(stacked_runs), ratio)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=250, help="gradient steps per timing")
    parser.add_argument("--warmup", type=int, default=100, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=12, help="timings per side (median)")
    parser.add_argument("--transitions", type=int, default=20_000, help="replay data size")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--skip-sb3", action="store_true", help="time emote and hand-written only")
    parser.add_argument(
        "--fused-adam", action="store_true", help="fused Adam on both sides (torch >= 2.4)"
    )
    parser.add_argument(
        "--stacked", action="store_true", help="only twin against stacked Q networks, CPU"
    )
    args = parser.parse_args()
    if args.stacked:
        episodes, env = pendulum_episodes(args.transitions)
        print(f"train_bench --stacked: emote SAC updates/s, twin against stacked Q networks "
              f"(cpu; 256x256, batch {BATCH}; median of {args.repeats} x {args.updates} updates, "
              "sides in turns)")  # fmt: skip
        for threads, (twin, stacked, ratio) in stacked_rates(
            episodes, env, args.updates, args.repeats
        ).items():
            print(f"  {threads} torch thread(s): twin {twin:7.1f} | stacked {stacked:7.1f} | "
                  f"stacked / twin {ratio:.3f}")  # fmt: skip
        return
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)

    episodes, env = pendulum_episodes(args.transitions)
    callbacks, loader = emote_sac(episodes, env, device, args.fused_adam)
    time_emote(callbacks, loader, args.warmup, device)
    hand_state = hand_sac(episodes, device, args.fused_adam)
    time_hand(hand_state, args.warmup, device)
    model = None
    if not args.skip_sb3:
        model = sb3_sac(episodes, env, device, args.fused_adam)
        time_sb3(model, args.warmup, device)

    emote_rates, hand_rates, sb3_rates = [], [], []
    timings = [
        lambda: hand_rates.append(time_hand(hand_state, args.updates, device)),
        lambda: emote_rates.append(time_emote(callbacks, loader, args.updates, device)),
    ]
    if model is not None:
        timings.append(lambda: sb3_rates.append(time_sb3(model, args.updates, device)))
    for repeat in range(args.repeats):
        for timing in timings if repeat % 2 == 0 else timings[::-1]:
            timing()

    threads = f", {torch.get_num_threads()} torch thread" if device.type == "cpu" else ""
    adam = "fused" if args.fused_adam else "default"
    print(f"train_bench: SAC updates/s ({device.type}{threads}; 256x256 networks, batch {BATCH}, "
          f"Pendulum-v1 sizes, {adam} Adam; median of {args.repeats} x {args.updates} "
          "updates, sides alternating)")  # fmt: skip
    hand, emote = statistics.median(hand_rates), statistics.median(emote_rates)
    paired = statistics.median(e / h for e, h in zip(emote_rates, hand_rates, strict=True))
    print(f"  hand-written SAC loop (plain torch):            {hand:8.1f} updates/s")
    print(f"  emote (Trainer + SAC callbacks + MemoryLoader): {emote:8.1f} updates/s")
    if sb3_rates:
        sb3 = statistics.median(sb3_rates)
        print(f"  stable-baselines3 SAC.train:                   {sb3:8.1f} updates/s")
    print(f"  ratio emote / hand-written: {paired:.3f} (target >= 0.95)")
    if sb3_rates:
        to_sb3 = statistics.median(e / s for e, s in zip(emote_rates, sb3_rates, strict=True))
        hand_sb3 = statistics.median(h / s for h, s in zip(hand_rates, sb3_rates, strict=True))
        print(f"  ratio emote / SB3: {to_sb3:.2f}, hand-written / SB3: {hand_sb3:.2f}")
    print("collection with a random policy into a Zarr store, env steps/s (median of 3; ratio "
          "to bare vector-env stepping, median of 3 pairs; target >= 0.9)")  # fmt: skip
    for env_id, num_envs in (("Pendulum-v1", 1), ("Pendulum-v1", 8), ("CartPole-v1", 8)):
        rates = collection_rates(env_id, num_envs, vector_steps=40_000 // num_envs)
        print(f"  {env_id:<12}{num_envs:>2} envs: bare {rates['bare'][0]:7.0f} | "
              + " | ".join(f"{name} {rate:7.0f} ({ratio:.2f})"
                           for name, (rate, ratio) in rates.items() if name != "bare"))  # fmt: skip


if __name__ == "__main__":
    main()
