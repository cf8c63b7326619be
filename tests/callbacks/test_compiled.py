"""Compiled updates: torch.compile'd losses and CUDA-graph replays train as eager training does."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import numpy as np
import pytest
import torch

from emote_core.algorithms.sac import AlphaLoss, PolicyLoss, QLoss, QTarget
from emote_core.callback import Callback
from emote_core.callbacks.compiled import (
    CapturedUpdate,
    capture_blockers,
    check_compile_mode,
    compile_methods,
    compiled_training_callbacks,
)
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.nn.action_value import ActionValueMlp
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.schedules import LinearSchedule
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), -1.0, 1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (3,))}),
)


def random_table(device: str, episodes: int = 20, length: int = 30) -> DictObsMemoryTable:
    """Episodes of random transitions, half TERMINAL, half INTERRUPTED."""
    table = DictObsMemoryTable(spaces=SPACES, maxlen=10_000, device=device, seed=3)
    rng = np.random.default_rng(0)
    for identity in range(episodes):
        table.add_sequence(
            identity,
            {
                "obs": rng.normal(size=(length + 1, 3)).astype(np.float32),
                "actions": rng.uniform(-1, 1, size=(length, 2)).astype(np.float32),
                "rewards": rng.normal(size=(length, 1)).astype(np.float32),
            },
            end_state=EpisodeState.TERMINAL if identity % 2 else EpisodeState.INTERRUPTED,
        )
    return table


def sac(device: str, **alpha_options) -> tuple[list[Callback], MemoryLoader]:
    """SAC's four callbacks on small networks, seeded, and a loader of batches of 64."""
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(32, 32)).to(device)
    q1 = ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(32, 32)).to(device)
    q2 = ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(32, 32)).to(device)
    ln_alpha = torch.zeros(1, device=device, requires_grad=True)

    def adam(parameters) -> torch.optim.Adam:
        return torch.optim.Adam(parameters, lr=3e-3)

    callbacks = [
        QTarget(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2, q1_target=copy.deepcopy(q1),
                q2_target=copy.deepcopy(q2)),
        QLoss(name="q1", q=q1, optimizer=adam(q1.parameters())),
        QLoss(name="q2", q=q2, optimizer=adam(q2.parameters())),
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2,
                   optimizer=adam(policy.parameters())),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=2, optimizer=adam([ln_alpha]),
                  **alpha_options),
    ]  # fmt: skip
    loader = MemoryLoader(table=random_table(device), rollout_count=64, rollout_length=1)
    return callbacks, loader


def weights(callbacks: list[Callback]) -> list[torch.Tensor]:
    """Every trained and target parameter, and the temperature."""
    target = callbacks[0]
    modules = [target.policy, target.q1, target.q2, target.q1_target, target.q2_target]
    found = [p.detach().cpu().clone() for m in modules for p in m.parameters()]
    return [*found, target.ln_alpha.detach().cpu().clone()]


def train(callbacks: list[Callback], loader: MemoryLoader, updates: int) -> None:
    torch.manual_seed(1)
    Trainer([*callbacks, BackPropStepsTerminator(bp_steps=updates)], loader).train()


def assert_same_training(eager: list[Callback], other: list[Callback], atol: float) -> None:
    for a, b in zip(weights(eager), weights(other), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)
    for a, b in zip(eager[1:], other[1:], strict=True):
        assert a.scalar_logs.keys() == b.scalar_logs.keys()
        for key, value in a.scalar_logs.items():
            assert b.scalar_logs[key] == pytest.approx(value, rel=1e-3, abs=atol), key


def test_compiled_losses_train_as_eager_losses_do_on_the_cpu() -> None:
    eager, loader = sac("cpu")
    train(eager, loader, 6)
    compiled, loader = sac("cpu")
    assert compile_methods(compiled, backend="aot_eager") == 5  # four losses and the target
    assert compile_methods(compiled, backend="aot_eager") == 0  # never twice
    train(compiled, loader, 6)
    assert_same_training(eager, compiled, atol=1e-6)


class LogReader(Callback):
    """Reads the callbacks' scalar logs after every other update, as a logger does."""

    def __init__(self, callbacks: list[Callback]) -> None:
        super().__init__(name="log_reader")
        self.callbacks = callbacks

    def end_batch(self, bp_step: int) -> None:
        if bp_step % 2 == 0:
            for callback in self.callbacks:
                _ = callback.scalar_logs


def compiled_graphs(
    callbacks: list[Callback], loader: MemoryLoader, updates: int, counts: Callable
) -> tuple[int, int]:
    """Trains ``updates`` steps with the callbacks' methods compiled (backend ``aot_eager``),
    their logs read as a logger reads them, and returns ``(graphs, graph breaks)`` as
    ``counts`` (the ``graph_counts`` fixture) saw them."""
    compile_methods(callbacks, backend="aot_eager")
    train([*callbacks, LogReader(callbacks)], loader, updates)
    return counts()


def test_each_compiled_method_is_one_graph_compiled_once(graph_counts: Callable) -> None:
    callbacks, loader = sac("cpu")
    # The target, two Q losses, the policy loss and the temperature: one whole graph each.
    # Logs read between updates, step numbers and the frozen Q networks recompile nothing.
    assert compiled_graphs(callbacks, loader, 8, graph_counts) == (5, 0)  # graphs, breaks


def test_many_losses_of_one_class_all_run_compiled(graph_counts: Callable) -> None:
    callbacks, loader = sac("cpu")
    target = callbacks[0]
    losses = []
    for k in range(10):  # beyond dynamo's 8 graphs per function
        q = ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(8,))
        losses.append(QLoss(name=f"q{k}", q=q, optimizer=torch.optim.Adam(q.parameters())))
    assert compiled_graphs([target, *losses], loader, 3, graph_counts) == (11, 0)


class StaticHelper(Callback):
    """Lists a static method (not bound to the instance) among its compiled methods."""

    compiled_methods = ("scale",)

    @staticmethod
    def scale(x: torch.Tensor) -> torch.Tensor:
        return 2.0 * x + 1.0


def test_a_listed_method_that_is_not_bound_compiles_as_it_is(graph_counts: Callable) -> None:
    callback = StaticHelper(name="helper")
    assert compile_methods([callback], backend="aot_eager") == 1
    assert getattr(callback.scale, "_emote_compiled", False)
    x = torch.arange(4.0)
    torch.testing.assert_close(callback.scale(x), 2.0 * x + 1.0)
    assert graph_counts() == (1, 0)
    assert compile_methods([callback], backend="aot_eager") == 0  # never twice


@pytest.mark.slow
def test_inductor_compiled_losses_train_as_eager_losses_do_on_the_cpu(monkeypatch) -> None:
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "fallback_random", True)  # eager's random draws, to compare
    eager, loader = sac("cpu")
    train(eager, loader, 6)
    compiled, loader = sac("cpu")
    compile_methods(compiled)
    train(compiled, loader, 6)
    assert_same_training(eager, compiled, atol=1e-5)


class PerStep(Callback):
    def begin_batch(self, bp_step: int) -> None:
        return None


class Cyclic(Callback):
    graph_safe = True

    def end_cycle(self) -> None:
        return None


def test_what_cannot_be_recorded_in_a_cuda_graph_is_named() -> None:
    callbacks, _ = sac("cpu", target_entropy=LinearSchedule(-1.0, -2.0, 100))
    schedule = torch.optim.lr_scheduler.StepLR(callbacks[1].optimizer, step_size=10)
    callbacks[1].lr_schedule = schedule
    callbacks[2].gradient_hook = lambda parameters: None
    reasons = capture_blockers([*callbacks, PerStep(), Cyclic(cycle=5)])
    assert reasons == [
        "'q1' (QLoss): it steps a learning-rate schedule",
        "'q2' (QLoss): a gradient hook (data-parallel averaging) runs after its backward pass",
        "'alpha' (AlphaLoss): its target entropy follows a schedule",
        "'PerStep' (PerStep): it does not declare its update safe to record in a CUDA graph "
        "(graph_safe)",
        "'Cyclic' (Cyclic): it runs on a cycle (begin_cycle/end_cycle)",
    ]
    assert capture_blockers(sac("cpu")[0]) == []


def test_cuda_graphs_on_a_cpu_train_eagerly_with_a_warning(caplog) -> None:
    callbacks, _ = sac("cpu")
    with caplog.at_level(logging.WARNING):
        kept, applied = compiled_training_callbacks(
            callbacks, mode="cuda_graphs", device=torch.device("cpu")
        )
    assert kept == callbacks and applied == "none"
    assert "CUDA graphs need a CUDA device" in caplog.text
    with pytest.raises(ConfigurationError, match="CUDA graphs need a CUDA device"):
        CapturedUpdate(callbacks, device="cpu")


def test_an_unknown_mode_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="'none', 'compile', 'cuda_graphs'"):
        check_compile_mode("fast")


def test_recipes_choose_the_mode_and_reject_unknown_ones() -> None:
    from emote_core.recipes.loading import load_recipe

    recipe = load_recipe("sac_pendulum", overrides=["training.compile=cuda_graphs"])
    assert recipe.training.compile == "cuda_graphs"
    assert load_recipe("sac_pendulum").training.compile == "none"
    with pytest.raises(ConfigurationError, match="compile"):
        load_recipe("sac_pendulum", overrides=["training.compile=fast"])


# On CUDA.


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_graph_replays_train_as_eager_updates_do(compiled: bool, monkeypatch) -> None:
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor, "fallback_random", True)
    eager, loader = sac("cuda")
    train(eager, loader, 12)
    recorded, loader = sac("cuda")
    trainer_callbacks, applied = compiled_training_callbacks(
        recorded, mode="compile+cuda_graphs" if compiled else "cuda_graphs",
        device=torch.device("cuda"),
    )  # fmt: skip
    assert applied.endswith("cuda_graphs")
    (captured,) = trainer_callbacks
    assert isinstance(captured, CapturedUpdate)
    train(trainer_callbacks, loader, 12)
    assert (captured.eager_steps, captured.replays) == (3, 9)
    assert_same_training(eager, recorded, atol=1e-5)
    assert recorded[1].optimizer.param_groups[0]["capturable"]


@pytest.mark.gpu
def test_replayed_logs_follow_the_latest_update_and_a_new_batch_size_records_again() -> None:
    callbacks, loader = sac("cuda")
    captured = CapturedUpdate(callbacks, device="cuda", warmup=1)
    train([captured], loader, 3)
    first = callbacks[1].scalar_logs["loss/q1"]
    train([captured], loader, 5)  # the same graph, replayed
    assert callbacks[1].scalar_logs["loss/q1"] != first
    assert len(captured._graphs) == 1
    loader.rollout_count = 32
    train([captured], loader, 2)
    assert len(captured._graphs) == 2
    assert all(torch.isfinite(w).all() for w in weights(callbacks))


def test_a_checkpoint_of_capturable_optimizers_resumes_eagerly_on_the_cpu() -> None:
    """A CUDA-graph run saves capturable Adam groups; eager CPU training cannot step with them."""
    trained, loader = sac("cpu")
    train(trained, loader, 2)
    saved = trained[1].state_dict()
    saved["optimizer_state_dict"]["param_groups"][0]["capturable"] = True
    resumed, loader = sac("cpu")
    resumed[1].load_state_dict(saved)
    group = resumed[1].optimizer.param_groups[0]
    assert group["capturable"] is False
    assert all(state["step"].device.type == "cpu" for state in resumed[1].optimizer.state.values())
    train(resumed, loader, 2)  # steps without "capturable" errors
    assert resumed[1].optimizer.state[group["params"][0]]["step"].item() == 4
