"""Encoders: the output width they report, channel layouts, and bad settings."""

from __future__ import annotations

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Conv1dEncoder, Conv2dEncoder, ImageEncoder, MlpEncoder


def test_conv2d_reports_the_width_it_returns() -> None:
    encoder = Conv2dEncoder(
        input_shape=(84, 84, 4), channels=[32, 64, 64], kernels=[8, 4, 3], strides=[4, 2, 1]
    )
    assert encoder.output_dim == 64 * 7 * 7  # the Atari DQN torso
    assert encoder(torch.zeros(2, 84, 84, 4)).shape == (2, encoder.output_dim)


def test_channels_last_and_channels_first_compute_the_same_features() -> None:
    torch.manual_seed(0)
    last = Conv2dEncoder(input_shape=(10, 12, 3), channels=[5], kernels=[3], strides=[1])
    first = Conv2dEncoder(
        input_shape=(3, 10, 12), channels=[5], kernels=[3], strides=[1], channels_last=False
    )
    first.load_state_dict(last.state_dict())
    images = torch.rand(4, 10, 12, 3)
    torch.testing.assert_close(last(images), first(images.permute(0, 3, 1, 2)))


def test_unflattened_output_keeps_its_spatial_shape() -> None:
    encoder = Conv2dEncoder(
        input_shape=(8, 8, 1), channels=[2], kernels=[3], padding=1, flatten=False
    )
    assert encoder.output_shape == (2, 8, 8)
    assert encoder(torch.zeros(1, 8, 8, 1)).shape == (1, 2, 8, 8)


def test_uint8_frames_are_accepted() -> None:
    encoder = Conv2dEncoder(input_shape=(8, 8, 1), channels=[2], kernels=[3])
    frames = torch.randint(0, 255, (3, 8, 8, 1), dtype=torch.uint8)
    torch.testing.assert_close(encoder(frames), encoder(frames.float()))


def test_conv1d_over_sequences() -> None:
    encoder = Conv1dEncoder(input_shape=(20, 3), channels=[8, 4], kernels=[5, 3], strides=[2, 1])
    assert encoder.output_dim == 4 * 6
    assert encoder(torch.randn(7, 20, 3)).shape == (7, 24)


@pytest.mark.parametrize("channels_last", [True, False])
def test_the_convolutions_see_observations_channels_first(channels_last: bool) -> None:
    shape = (20, 3) if channels_last else (3, 20)
    encoder = Conv1dEncoder(
        input_shape=shape, channels=[4], kernels=[1], channels_last=channels_last
    )
    assert encoder.input_shape == shape and encoder.conv_input_shape == (3, 20)


def test_mlp_encoder_widths() -> None:
    encoder = MlpEncoder(input_dim=3, hidden_dims=(8, 5))
    assert encoder.output_dim == 5 and encoder(torch.randn(2, 3)).shape == (2, 5)
    assert MlpEncoder(input_dim=3, hidden_dims=()).output_dim == 3


def test_inconsistent_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="one kernel and stride per layer"):
        Conv2dEncoder(input_shape=(8, 8, 1), channels=[2, 3], kernels=[3])
    with pytest.raises(ConfigurationError, match="too small"):
        Conv2dEncoder(input_shape=(4, 4, 1), channels=[2], kernels=[8])
    with pytest.raises(ConfigurationError, match="3 dimensions"):
        Conv2dEncoder(input_shape=(8, 8), channels=[2], kernels=[3])


def small_image_encoder(**kwargs) -> ImageEncoder:
    torch.manual_seed(0)
    settings = {"image_shape": (12, 10, 3), "channels": [4, 4], "kernels": [3, 3],
                "strides": [2, 1], "feature_dim": 6} | kwargs  # fmt: skip
    return ImageEncoder(**settings)


def test_image_encoder_reads_images_flat_or_shaped_and_scales_pixels() -> None:
    encoder = small_image_encoder()
    pixels = torch.randint(0, 256, (5, 12, 10, 3), dtype=torch.uint8)
    features = encoder(pixels)
    assert features.shape == (5, 6) and encoder.output_dim == 6
    assert features.abs().max() < 1.0  # tanh of layer-normalised features
    torch.testing.assert_close(encoder(pixels.reshape(5, -1)), features)
    torch.testing.assert_close(encoder(pixels.float()), features)  # floats scaled the same
    unscaled = small_image_encoder(scale=1.0)
    torch.testing.assert_close(unscaled(pixels.float() / 255.0), features)


def test_image_encoder_refuses_images_of_another_shape_or_dtype() -> None:
    encoder = small_image_encoder()
    with pytest.raises(ConfigurationError, match=r"shape \(batch, 12, 10, 3\) or \(batch, 360\)"):
        encoder(torch.zeros(2, 10, 12, 3))
    with pytest.raises(ConfigurationError, match="or \\(batch, 360\\); got \\(2, 359\\)"):
        encoder(torch.zeros(2, 359))
    with pytest.raises(ConfigurationError, match=r"uint8 or float pixels; got torch\.bool"):
        encoder(torch.zeros(2, 12, 10, 3, dtype=torch.bool))
    with pytest.raises(ConfigurationError, match="feature_dim must hold positive integers"):
        small_image_encoder(feature_dim=0)
    with pytest.raises(ConfigurationError, match="too small"):
        small_image_encoder(image_shape=(3, 3, 1), kernels=[5, 5])
