"""Evaluation inside training leaves the training's random streams alone, replays the same
episodes every time, and the recipe reaches TensorBoard's HParams as flat scalars."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from emote_core.assembly.builders import make_env, make_networks
from emote_core.assembly.monitoring import recipe_hparams, training_evaluation
from emote_core.assembly.training import build_training
from emote_core.recipes import load_recipe
from emote_core.runs import prepare_run

TINY = ["memory.warmup_steps=64", "memory.batch_size=16", "training.checkpoint_interval=1000"]


def networks_of(name: str, overrides: list[str]):
    recipe = load_recipe(name, overrides)
    env = make_env(recipe, num_envs=1)
    spaces = env.spaces
    env.close()
    return recipe, make_networks(recipe, spaces, torch.device("cpu")), spaces


@pytest.mark.parametrize("deterministic", ["true", "false"])
def test_an_evaluation_replays_its_episodes_and_leaves_torch_rng_alone(deterministic: str) -> None:
    recipe, networks, spaces = networks_of(
        "sac_hit_the_middle", ["eval.episodes=3", f"eval.deterministic={deterministic}"]
    )
    evaluate = training_evaluation(recipe, networks, spaces, torch.device("cpu"))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, second = evaluate(), evaluate()
    assert torch.equal(torch.get_rng_state(), before)
    assert first["returns"] == second["returns"] and len(first["returns"]) == 3
    assert first["seed"] == recipe.eval.seed != recipe.seed
    assert first["deterministic"] is (deterministic == "true")


def train_tiny(run_dir: Path, overrides: list[str]) -> dict[str, torch.Tensor]:
    recipe = load_recipe("sac_hit_the_middle", TINY + overrides)
    run = prepare_run(run_dir, recipe=recipe, command=["test"])
    torch.manual_seed(recipe.seed)  # as emote train does
    setup = build_training(
        recipe, run=run, device=torch.device("cpu"), bp_steps=30, terminal_log=False
    )
    try:
        setup.trainer.train()
    finally:
        setup.env.close()
    return {key: value.clone() for key, value in setup.networks.acting.state_dict().items()}


def test_evaluating_while_training_does_not_change_what_is_learned(
    tmp_path: Path, one_torch_thread: None
) -> None:
    plain = train_tiny(tmp_path / "a", ["eval.interval=0"])
    # Stochastic evaluations every 5 updates: six evaluations' worth of sampled actions.
    watched = train_tiny(tmp_path / "b", ["eval.interval=5", "eval.deterministic=false"])
    assert plain.keys() == watched.keys()
    for key in plain:
        assert torch.equal(plain[key], watched[key]), key
    assert (tmp_path / "b" / "checkpoints" / "best.tar").is_file()


def test_recipe_hparams_are_flat_scalars() -> None:
    recipe = load_recipe("sac_lunar_lander")
    hparams = recipe_hparams(recipe)
    assert hparams["sac.learning_rate"] == pytest.approx(7.3e-4)
    assert hparams["env.id"] == "LunarLander-v3"
    assert hparams["env.kwargs.continuous"] is True
    assert hparams["eval.interval"] == 10_000 and hparams["seed"] == 0
    assert "sac.hidden_dims" not in hparams  # a list: not a scalar TensorBoard can compare
    assert "eval.min_return" in hparams and "logging.wandb_entity" not in hparams  # None
    assert all(isinstance(value, bool | int | float | str) for value in hparams.values())
