"""The ensemble's loss against a hand computation, its bootstrap, its elites and its sampling,
and the single deterministic network's share of the same interface."""

from __future__ import annotations

import math

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.models import DeterministicModel, EnsembleLinearLayer, EnsembleOfGaussian


def tiny(**overrides) -> EnsembleOfGaussian:
    arguments = {
        "in_size": 2,
        "out_size": 2,
        "ensemble_size": 3,
        "num_elites": 2,
        "hidden_size": 4,
        "num_layers": 1,
        "generator": torch.Generator().manual_seed(0),
    }
    return EnsembleOfGaussian(**(arguments | overrides))


def copy_of(generator: torch.Generator) -> torch.Generator:
    twin = torch.Generator()
    twin.set_state(generator.get_state())
    return twin


def noise(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def fixed_outputs(model: EnsembleOfGaussian, means: list[float], raw_logvar: float) -> None:
    """Member ``e`` predicts ``means[e]`` in every dimension whatever its input."""
    with torch.no_grad():
        model.output.weight.zero_()
        for member, value in enumerate(means):
            model.output.bias[member, 0, : model.out_size] = value
            model.output.bias[member, 0, model.out_size :] = raw_logvar


def test_the_loss_is_the_bootstrapped_gaussian_nll_plus_the_bound_penalty() -> None:
    model = tiny()
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(1))
    target = torch.randn(6, 2, generator=torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    index = torch.randint(6, (3, 6), generator=copy_of(generator))
    loss, info = model.loss(x, target, generator=generator)

    expected, squared_errors, logvars = 0.0, [], []
    for member in range(3):
        raw = model.output(model.hidden(x[index[member]]))[member].tolist()
        member_nll = 0.0
        for row in range(6):
            goal = target[index[member, row]].tolist()
            for dim in range(2):
                mean, logvar = raw[row][dim], raw[row][2 + dim]
                logvar = 0.5 - softplus(0.5 - logvar)
                logvar = -10.0 + softplus(logvar + 10.0)
                error = (mean - goal[dim]) ** 2
                member_nll += 0.5 * (error * math.exp(-logvar) + logvar) / 6
                squared_errors.append(error)
                logvars.append(logvar)
        expected += member_nll
    expected += 0.01 * (2 * 0.5 - 2 * -10.0)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert info["mse"].item() == pytest.approx(sum(squared_errors) / 36, abs=1e-6)
    assert info["mean_logvar"].item() == pytest.approx(sum(logvars) / 36, abs=1e-6)


def test_the_penalty_on_the_logvar_bounds_is_in_the_loss_and_trains_them() -> None:
    x, target = noise(8, 2, seed=1), noise(8, 2, seed=2)
    penalised, free = tiny(logvar_penalty=0.5), tiny(logvar_penalty=0.0)
    with_penalty, _ = penalised.loss(x, target, generator=torch.Generator().manual_seed(4))
    without, _ = free.loss(x, target, generator=torch.Generator().manual_seed(4))
    assert (with_penalty - without).item() == pytest.approx(0.5 * (2 * 0.5 + 2 * 10.0), abs=1e-5)
    with_penalty.backward()
    without.backward()
    # The penalty pushes max_logvar down and min_logvar up, by its weight.
    torch.testing.assert_close(
        penalised.max_logvar.grad - free.max_logvar.grad, torch.full((1, 1, 2), 0.5)
    )
    torch.testing.assert_close(
        penalised.min_logvar.grad - free.min_logvar.grad, torch.full((1, 1, 2), -0.5)
    )


def test_the_log_variance_stays_within_the_learned_bounds() -> None:
    model = tiny()
    with torch.no_grad():
        model.max_logvar.fill_(2.0)
        model.min_logvar.fill_(-3.0)
    x = noise(5, 2, seed=11)
    tail = math.log1p(math.exp(-5.0))  # softplus's overshoot for bounds 5 apart
    for raw, bound in ((1000.0, 2.0), (-1000.0, -3.0)):
        fixed_outputs(model, [0.0, 0.0, 0.0], raw)
        _, logvar = model(x)
        assert logvar.min().item() >= -3.0 - 1e-6
        assert logvar.max().item() <= 2.0 + tail + 1e-6
        assert logvar.mean().item() == pytest.approx(bound, abs=tail + 1e-6)
    fixed_outputs(model, [0.0, 0.0, 0.0], -0.5)
    _, logvar = model(x)
    assert logvar.mean().item() == pytest.approx(-0.5, abs=0.1)


def test_each_member_trains_on_its_own_resample_of_the_batch() -> None:
    model = tiny(ensemble_size=4, num_elites=1)
    with torch.no_grad():  # identical members: only their rows can tell them apart
        for layer in model.modules():
            if isinstance(layer, EnsembleLinearLayer):
                layer.weight.copy_(layer.weight[0].expand_as(layer.weight))
                layer.bias.copy_(layer.bias[0].expand_as(layer.bias))
    x = torch.arange(16.0).reshape(8, 2)
    target = torch.randn(8, 2, generator=torch.Generator().manual_seed(5))
    seen: list[torch.Tensor] = []
    model.hidden[0].register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0].clone()))
    generator = torch.Generator().manual_seed(6)
    index = torch.randint(8, (4, 8), generator=copy_of(generator))
    loss, _ = model.loss(x, target, generator=generator)
    loss.backward()

    assert seen[0].shape == (4, 8, 2)
    for member in range(4):
        assert torch.equal(seen[0][member], x[index[member]])
    row_sets = {tuple(sorted(rows.tolist())) for rows in index}
    assert len(row_sets) > 1
    assert any(len(set(rows.tolist())) < 8 for rows in index)  # drawn with replacement
    gradient = model.output.weight.grad
    assert not torch.allclose(gradient[0], gradient[1])
    again, _ = model.loss(x, target, generator=torch.Generator().manual_seed(6))
    assert again.item() == loss.item()


def test_member_mse_scores_every_member_on_the_same_rows() -> None:
    model = tiny()
    fixed_outputs(model, [0.0, 1.0, 3.0], 0.0)
    x, target = noise(5, 2, seed=12), torch.ones(5, 2)
    scores = model.member_mse(x, target)
    assert scores.tolist() == pytest.approx([1.0, 0.0, 4.0])
    assert not scores.requires_grad


def test_set_elites_keeps_the_lowest_scores_and_they_round_trip_through_a_state_dict() -> None:
    model = tiny(ensemble_size=5, num_elites=3)
    assert model.elites.tolist() == [0, 1, 2]
    model.set_elites(torch.tensor([3.0, 1.0, 2.0, 0.0, 5.0]))
    assert model.elites.tolist() == [3, 1, 2]
    restored = tiny(ensemble_size=5, num_elites=3, generator=torch.Generator().manual_seed(9))
    restored.load_state_dict(model.state_dict())
    assert restored.elites.tolist() == [3, 1, 2]
    x = noise(4, 2, seed=13)
    torch.testing.assert_close(restored(x), model(x))


def test_sample_draws_each_row_from_an_elite_and_adds_its_own_noise() -> None:
    model = tiny()
    fixed_outputs(model, [0.0, 10.0, 20.0], -1000.0)  # logvar at -10: std exp(-5)
    model.set_elites(torch.tensor([5.0, 1.0, 0.0]))  # elites [2, 1]
    x = noise(200, 2, seed=14)
    generator = torch.Generator().manual_seed(7)
    twin = copy_of(generator)
    samples = model.sample(x, generator)

    choice = torch.randint(2, (200,), generator=twin)
    drawn = torch.randn((200, 2), generator=twin)
    chosen = torch.tensor([20.0, 10.0])[choice].unsqueeze(-1)
    torch.testing.assert_close(samples, chosen + math.exp(-5.0) * drawn)
    assert ((samples - 10.0).abs() < 0.1).any() and ((samples - 20.0).abs() < 0.1).any()
    assert ((samples - 10.0).abs() < 0.1).logical_or((samples - 20.0).abs() < 0.1).all()
    assert torch.equal(model.sample(x, torch.Generator().manual_seed(7)), samples)
    assert not torch.equal(model.sample(x, torch.Generator().manual_seed(8)), samples)


def test_a_deterministic_switch_samples_the_chosen_member_s_mean_without_noise() -> None:
    model = tiny()
    with torch.no_grad():
        model.output.bias.normal_(generator=torch.Generator().manual_seed(1))
    x = noise(50, 2, seed=15)
    model.deterministic = True
    generator = torch.Generator().manual_seed(2)
    choice = torch.randint(2, (50,), generator=copy_of(generator))
    mean, _ = model(x)
    expected = mean[model.elites[choice], torch.arange(50)]
    assert torch.equal(model.sample(x, generator), expected)
    model.deterministic = False
    assert not torch.equal(model.sample(x, torch.Generator().manual_seed(2)), expected)


def test_an_ensemble_built_deterministic_has_no_variance_and_a_squared_error_loss() -> None:
    model = tiny(deterministic=True)
    x, target = noise(6, 2, seed=16), noise(6, 2, seed=17)
    mean, logvar = model(x)
    assert mean.shape == (3, 6, 2) and logvar is None
    assert model.output.out_size == 2 and model.max_logvar is None
    generator = torch.Generator().manual_seed(3)
    index = torch.randint(6, (3, 6), generator=copy_of(generator))
    loss, info = model.loss(x, target, generator=generator)
    with torch.no_grad():
        expected = sum(
            0.5 * (model(x[index[member]])[0][member] - target[index[member]]).square().sum() / 6
            for member in range(3)
        )
    assert loss.item() == pytest.approx(float(expected), abs=1e-6)
    assert set(info) == {"mse"}
    samples = model.sample(x, torch.Generator().manual_seed(0))
    assert torch.equal(samples, model.sample(x, torch.Generator().manual_seed(0)))
    with pytest.raises(ConfigurationError, match=r"predicts no variance.*deterministic=False"):
        model.deterministic = False


def test_the_deterministic_model_is_an_ensemble_of_one() -> None:
    model = DeterministicModel(
        in_size=3,
        out_size=2,
        hidden_size=8,
        num_layers=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert (model.ensemble_size, model.num_elites, model.deterministic) == (1, 1, True)
    assert model.elites.tolist() == [0]
    x, target = noise(5, 3, seed=18), noise(5, 2, seed=19)
    mean, logvar = model(x)
    assert mean.shape == (1, 5, 2) and logvar is None
    assert torch.equal(model.sample(x), mean[0].detach())
    loss, info = model.loss(x, target)
    assert loss.item() == pytest.approx(0.5 * (mean[0] - target).square().sum().item() / 5)
    assert info["mse"].item() == pytest.approx((mean[0] - target).square().mean().item())
    assert model.member_mse(x, target).tolist() == pytest.approx([info["mse"].item()])
    model.set_elites(torch.tensor([2.0]))
    assert model.elites.tolist() == [0]
    again = DeterministicModel(
        in_size=3,
        out_size=2,
        hidden_size=8,
        num_layers=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(again(x)[0], mean)
    with pytest.raises(ConfigurationError, match="predicts no variance"):
        model.deterministic = False


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tiny(ensemble_size=0), "ensemble_size must be a positive integer; got 0"),
        (
            lambda: tiny(num_elites=0),
            r"num_elites must be between 1 and ensemble_size \(3\); got 0",
        ),
        (
            lambda: tiny(num_elites=4),
            r"num_elites must be between 1 and ensemble_size \(3\); got 4",
        ),
        (lambda: tiny(hidden_size=0), "hidden_size must be a positive integer; got 0"),
        (lambda: tiny(num_layers=-1), "num_layers must be a positive integer; got -1"),
        (
            lambda: tiny(activation="gelu"),
            "activation must be one of 'elu', 'relu', 'silu', 'tanh'; got 'gelu'",
        ),
        (
            lambda: DeterministicModel(in_size=2, out_size=2, activation="swish"),
            "activation must be one of 'elu', 'relu', 'silu', 'tanh'; got 'swish'",
        ),
        (lambda: tiny(logvar_penalty=-1.0), "logvar_penalty must be 0 or more; got -1.0"),
        (
            lambda: tiny().set_elites(torch.zeros(2)),
            r"one score per member, shape \(3,\); got \(2,\)",
        ),
        (
            lambda: tiny().loss(torch.zeros(4, 2), torch.zeros(3, 2)),
            r"inputs \(B, 2\) and targets \(B, 2\) with the same B >= 1; got \(4, 2\) and \(3, 2\)",
        ),
        (
            lambda: DeterministicModel(in_size=2, out_size=1)(torch.zeros(3, 4, 2)),
            r"inputs of shape \(B, 2\) or \(1, B, 2\); got \(3, 4, 2\)",
        ),
    ],
)
def test_bad_arguments_are_refused_in_one_line(build, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        build()
    assert "\n" not in str(raised.value)
