"""The action VAE: its KL against hand-computed values, its loss, sampling and refusals."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from emote_core.algorithms.genrl import (
    MlpActionDecoder,
    MlpActionEncoder,
    VariationalAutoencoder,
    gaussian_kl,
    make_vae,
    reparameterise,
    vae_loss,
)
from emote_core.errors import ConfigurationError


def small_vae(**overrides: object) -> VariationalAutoencoder:
    settings: dict[str, object] = {
        "observation_dim": 3, "action_dim": 2, "latent_dim": 2, "hidden_dims": (8,), "beta": 0.5,
    }  # fmt: skip
    settings.update(overrides)
    torch.manual_seed(0)
    return make_vae(**settings)  # type: ignore[arg-type]


def test_the_kl_to_the_prior_matches_a_hand_computation() -> None:
    mean = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    log_var = torch.tensor([[0.0, 0.0], [math.log(4.0), 0.0]])
    # Row 0 is the prior itself. Row 1: 0.5 (4 + 1 - 1 - ln 4) + 0.5 (1 + 4 - 1 - 0) = 4 - ln 2.
    assert gaussian_kl(mean, log_var).tolist() == pytest.approx([0.0, 4.0 - math.log(2.0)])


def test_the_kl_agrees_with_torch_distributions_on_random_posteriors() -> None:
    generator = torch.Generator().manual_seed(3)
    mean = torch.randn(5, 4, generator=generator)
    log_var = torch.randn(5, 4, generator=generator)
    expected = kl_divergence(Normal(mean, (0.5 * log_var).exp()), Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(gaussian_kl(mean, log_var), expected)


def test_the_loss_is_the_mean_squared_error_plus_beta_times_the_mean_kl() -> None:
    reconstruction = torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    actions = torch.tensor([[0.0, 0.0], [0.0, 1.0]])  # squared errors 0.25 and 1 over 4 entries
    mean = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    log_var = torch.tensor([[0.0, 0.0], [math.log(4.0), 0.0]])
    terms = vae_loss(reconstruction, actions, mean, log_var, beta=0.1)
    kl = (4.0 - math.log(2.0)) / 2
    assert terms.reconstruction.item() == pytest.approx(1.25 / 4)
    assert terms.kl.item() == pytest.approx(kl)
    assert terms.loss.item() == pytest.approx(1.25 / 4 + 0.1 * kl)


def test_a_generator_makes_the_latent_reproducible_and_the_sample_reparameterised() -> None:
    mean = torch.tensor([[1.0, -1.0]], requires_grad=True)
    log_var = torch.tensor([[math.log(0.25), 0.0]], requires_grad=True)
    first = reparameterise(mean, log_var, generator=torch.Generator().manual_seed(7))
    again = reparameterise(mean, log_var, generator=torch.Generator().manual_seed(7))
    noise = torch.randn(1, 2, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(first, again)
    torch.testing.assert_close(first, mean + torch.tensor([[0.5, 1.0]]) * noise)
    first.sum().backward()  # the sample is differentiable in the mean and the variance
    assert mean.grad.tolist() == [[1.0, 1.0]]
    assert log_var.grad.abs().min().item() > 0


def test_forward_gives_bounded_reconstructions_and_its_latent_is_the_sample() -> None:
    vae = small_vae()
    observation = 100 * torch.randn(16, 3)
    action = torch.rand(16, 2) * 2 - 1
    output = vae(action, observation, generator=torch.Generator().manual_seed(1))
    assert output.reconstruction.shape == (16, 2)
    assert output.reconstruction.abs().max().item() <= 1.0  # tanh: emote's action bounds
    expected = reparameterise(
        output.mean, output.log_var, generator=torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(output.latent, expected)
    torch.testing.assert_close(output.reconstruction, vae.decode(output.latent, observation))


def test_an_unsquashed_decoder_is_not_bounded() -> None:
    vae = small_vae(squash=False)
    with torch.no_grad():
        vae.decoder.head.bias.fill_(5.0)
    assert vae.decode(torch.zeros(4, 2), torch.zeros(4, 3)).min().item() > 1.0


def test_the_loss_trains_both_halves() -> None:
    vae = small_vae()
    terms = vae.loss(
        torch.rand(8, 2), torch.randn(8, 3), generator=torch.Generator().manual_seed(0)
    )
    terms.loss.backward()
    for part in (vae.encoder, vae.decoder):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"latent_dim": 0}, r"latent_dim must be a positive integer; got 0"),
        ({"beta": -1.0}, r"beta must be finite and >= 0; got -1.0"),
        ({"beta": float("nan")}, r"beta must be finite and >= 0; got nan"),
        ({"action_dim": 0}, r"action_dim must be a positive integer; got 0"),
    ],
)
def test_bad_settings_are_refused_in_one_line(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as caught:
        small_vae(**overrides)
    assert "\n" not in str(caught.value)


def test_parts_of_different_widths_are_refused_in_one_line() -> None:
    encoder = MlpActionEncoder(action_dim=2, observation_dim=3, latent_dim=2, hidden_dims=())
    with pytest.raises(
        ConfigurationError, match=r"the decoder has latent_dim 3 but the VAE has latent_dim 2"
    ) as caught:
        VariationalAutoencoder(
            encoder, MlpActionDecoder(latent_dim=3, observation_dim=3, action_dim=2), latent_dim=2,
            beta=0.1,
        )  # fmt: skip
    assert "\n" not in str(caught.value)
    other_observations = MlpActionDecoder(latent_dim=2, observation_dim=4, action_dim=2)
    with pytest.raises(
        ConfigurationError, match=r"encoder has observation_dim 3 but the decoder has 4"
    ):
        VariationalAutoencoder(encoder, other_observations, latent_dim=2, beta=0.1)


def test_inputs_of_the_wrong_width_are_refused_in_one_line() -> None:
    vae = small_vae()
    with pytest.raises(
        ConfigurationError, match=r"takes actions of width 2; got width 3"
    ) as caught:
        vae(torch.zeros(4, 3), torch.zeros(4, 3))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigurationError, match=r"takes observations of width 3; got width 5"):
        vae.loss(torch.zeros(4, 2), torch.zeros(4, 5))
    with pytest.raises(ConfigurationError, match=r"takes latents of width 2; got width 1"):
        vae.decode(torch.zeros(4, 1), torch.zeros(4, 3))


class WrongWidthEncoder(nn.Module):
    """An encoder without declared widths whose latent is narrower than the VAE's."""

    def forward(self, action: torch.Tensor, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.zeros(len(action), 1), torch.zeros(len(action), 1)


def test_an_encoder_giving_latents_of_another_width_is_refused() -> None:
    decoder = MlpActionDecoder(latent_dim=2, observation_dim=3, action_dim=2)
    vae = VariationalAutoencoder(WrongWidthEncoder(), decoder, latent_dim=2, beta=0.1)
    with pytest.raises(ConfigurationError, match=r"both must be \(batch, 2\)"):
        vae(torch.zeros(4, 2), torch.zeros(4, 3))


class UpstreamStylePart(nn.Module):
    """A part declaring its widths as upstream emote's did: ``input_size``, ``output_size``."""

    def __init__(self, input_size: int, output_size: int, halves: int = 1) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.linear = nn.Linear(input_size + 3, halves * output_size)

    def forward(self, x, condition):
        out = self.linear(torch.cat([x, condition], dim=-1))
        return out.chunk(2, dim=-1) if out.shape[-1] == 2 * self.output_size else out


def test_upstreams_call_reads_the_latent_width_from_the_parts_and_moves_to_the_device() -> None:
    encoder, decoder = UpstreamStylePart(2, 4, halves=2), UpstreamStylePart(4, 2)
    vae = VariationalAutoencoder(encoder=encoder, decoder=decoder, device="meta", beta=0.1)
    assert vae.latent_dim == 4 and next(vae.parameters()).device.type == "meta"
    with pytest.raises(ConfigurationError, match=r"different widths \[3, 4\] .*pass latent_dim"):
        VariationalAutoencoder(encoder, UpstreamStylePart(3, 2), beta=0.1)
    with pytest.raises(ConfigurationError, match=r"declare none"):
        VariationalAutoencoder(nn.Linear(1, 1), nn.Linear(1, 1), beta=0.1)
