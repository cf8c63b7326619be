"""Pixel SAC (``sac.encoder = "conv"``) and the ``curl`` add-on: one image encoder that both Q
losses and CURL train and the policy reads without gradients; what neither accepts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.algorithms.curl import CurlAddOn, CurlConfig
from emote_core.algorithms.pixels import ConvEncoderConfig, ObservationEncoder
from emote_core.algorithms.registry import BuildContext, get_addon, get_algorithm
from emote_core.algorithms.sac import SacConfig
from emote_core.algorithms.sac.family import SacCritic
from emote_core.errors import ConfigurationError
from emote_core.nn import LayerInit
from emote_core.nn.curl import CurlLoss
from emote_core.nn.inputs import flatten_observation
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace

IMAGE = (16, 16, 3)


def spaces(**state: BoxSpace) -> MDPSpace:
    state = state or {"obs": BoxSpace(np.uint8, IMAGE, low=0, high=255, frames=3)}
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (2,), low=-1.0, high=1.0),
        state=DictSpace(state),
    )


def conv_config(**conv) -> SacConfig:
    table = {"channels": [4, 4], "kernels": [3, 3], "strides": [2, 1], "feature_dim": 8} | conv
    return SacConfig(hidden_dims=[16], encoder=ObservationEncoder.CONV,
                     conv=ConvEncoderConfig(**table))  # fmt: skip


def build(config: SacConfig, space: MDPSpace | None = None):
    torch.manual_seed(0)
    context = BuildContext(spaces=space or spaces(), device=torch.device("cpu"), env_id="test")
    return get_algorithm("sac").make_networks(config, context), context


def batch(size: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"obs": torch.randint(0, 256, (size, *IMAGE), dtype=torch.uint8, generator=generator)}


def test_one_encoder_reads_the_images_for_both_q_networks_and_the_policy() -> None:
    networks, _ = build(conv_config())
    key, encoder = networks.image_encoder
    assert key == "obs" and encoder.output_dim == 8
    assert networks.q1.obs_encoder is networks.q2.obs_encoder is networks.policy.encoder is encoder
    # The targets are copies, encoders included: the online one's training does not move them.
    assert networks.targets["q1"].obs_encoder is not encoder
    inputs = flatten_observation(batch())  # what the losses hand the networks: (B, H * W * C)
    actions = torch.zeros(6, 2)
    assert networks.q1(observation=inputs, actions=actions).shape == (6, 1)
    assert networks.policy.sample(inputs)[0].shape == (6, 2)


@pytest.mark.parametrize("start", ["orthogonal", "torch"])
def test_the_q_heads_over_the_image_encoder_start_as_sac_initialization_says(start: str) -> None:
    """As upstream's shared-encoder Q network (an ActionValueMlp over the features), and as the
    MLP path's Q networks: ``[sac] initialization`` decides, the encoder keeps its own start."""
    config = conv_config()
    config.initialization = LayerInit(start)
    networks, _ = build(config)
    for q in (networks.q1, networks.q2):
        head = [m for m in q.encoder.modules() if isinstance(m, torch.nn.Linear)]
        head.append(q.final_layer)
        assert len(head) == 2  # one hidden layer of 16, then the value
        assert all(bool(layer.bias.eq(0).all()) == (start == "orthogonal") for layer in head)
    encoder_weights = networks.image_encoder[1].state_dict()
    default_start = build(conv_config())[0].image_encoder[1].state_dict()
    torch.testing.assert_close(encoder_weights, default_start)


def test_q_losses_train_the_encoder_and_the_policy_does_not() -> None:
    networks, _ = build(conv_config())
    _, encoder = networks.image_encoder
    inputs = flatten_observation(batch())
    actions, log_probs = networks.policy.sample(inputs)
    (log_probs.sum() + actions.sum()).backward()
    assert all(p.grad is None for p in encoder.parameters())
    assert all(p.grad is not None for p in networks.policy.head.parameters())
    networks.q1(observation=inputs, actions=actions.detach()).sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())


def test_mlp_networks_read_no_images_through_an_encoder() -> None:
    networks, _ = build(SacConfig(hidden_dims=[16]), spaces(obs=BoxSpace(np.float32, (3,))))
    assert networks.image_encoder is None


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"obs": BoxSpace(np.float32, (5,))}, r"needs \(height, width, channels\) images"),
        ({"a": BoxSpace(np.uint8, IMAGE), "b": BoxSpace(np.float32, (2,))},
         "reads one image entry, and 'test' observations have 2 entries"),
    ],
)  # fmt: skip
def test_conv_networks_refuse_observations_that_are_not_one_image(state, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build(conv_config(), spaces(**state))


def test_conv_networks_refuse_a_named_entry_the_env_does_not_have() -> None:
    with pytest.raises(ConfigurationError, match="names 'pixels', which 'test' observations"):
        build(conv_config(observation_key="pixels"))


def test_conv_networks_refuse_kernels_that_leave_nothing_of_the_image() -> None:
    with pytest.raises(ConfigurationError, match=r"'sac\.conv' for 'test': .*too small"):
        build(conv_config(kernels=[9, 9]))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SacConfig(conv=ConvEncoderConfig(feature_dim=7)),
         "'sac.conv' configures an image encoder but 'sac.encoder' is 'mlp'"),
        (conv_config(strides=[2]), "one kernel and one stride per channel count"),
        (conv_config(channels=[]), "'sac.conv.channels' must be a non-empty list"),
        (conv_config(feature_dim=0), "'sac.conv.feature_dim' must be a positive integer"),
    ],
)  # fmt: skip
def test_the_conv_table_is_validated(config: SacConfig, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        get_algorithm("sac").validate(config, source="r.toml")


def test_conv_with_an_hl_gauss_critic_is_refused() -> None:
    config = conv_config()
    config.critic = SacCritic.HL_GAUSS
    with pytest.raises(ConfigurationError, match="HL-Gauss critic on images is not built"):
        get_algorithm("sac").validate(config, source="r.toml")


def test_the_curl_add_on_trains_the_shared_encoder() -> None:
    networks, context = build(conv_config())
    addon = get_addon("curl")
    assert isinstance(addon, CurlAddOn)
    (loss,) = addon.callbacks(CurlConfig(), networks, parts=None, context=context)
    assert isinstance(loss, CurlLoss)
    _, encoder = networks.image_encoder
    assert loss.encoder is encoder and loss.observation_key == "obs"
    before = [p.detach().clone() for p in encoder.parameters()]
    loss.backward(observation=batch())
    assert any(not torch.equal(a, p) for a, p in zip(before, encoder.parameters(), strict=True))


def test_the_curl_add_on_refuses_networks_without_an_image_encoder() -> None:
    networks, context = build(SacConfig(hidden_dims=[16]), spaces(obs=BoxSpace(np.float32, (3,))))
    with pytest.raises(ConfigurationError, match="read no images through one; set the algorithm"):
        get_addon("curl").callbacks(CurlConfig(), networks, parts=None, context=context)


def test_the_curl_add_on_refuses_environments_without_images() -> None:
    with pytest.raises(ConfigurationError, match=r"learns from \(height, width, channels\)"):
        get_addon("curl").check(
            CurlConfig(), get_algorithm("sac"), spaces(obs=BoxSpace(np.float32, (3,))), env_id="x"
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tau": 0.0}, "'curl.tau' must be above 0"),
        ({"tau": 1.5}, r"'curl.tau' must be in \[0.0, 1.0\]"),
        ({"temperature": -1.0}, "'curl.temperature' must be in"),
        ({"projection_dim": 0}, "'curl.projection_dim' must be a positive integer"),
        ({"min_mask_relative_size": 0.5, "max_mask_relative_size": 0.3}, "is below"),
    ],
)
def test_the_curl_table_is_validated(change: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        get_addon("curl").validate(CurlConfig(**change), source="r.toml")
