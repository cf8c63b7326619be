"""Encoders: networks that turn one observation tensor into a flat feature vector.

Every encoder has an ``output_dim`` attribute, the width of the features it returns, so heads can
be sized without running it by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.nn.initialization import orthogonal_init_
from emote_core.utils.checks import positive_ints

Activation = Callable[[], nn.Module]
"""A factory of activation modules, such as ``nn.ReLU``."""


class MlpEncoder(nn.Module):
    """Linear layers, each followed by an activation.

    Args:
        input_dim: The width of the input.
        hidden_dims: The width of each layer; empty makes the identity.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self, *, input_dim: int, hidden_dims: Sequence[int], activation: Activation = nn.ReLU
    ) -> None:
        super().__init__()
        (input_dim,) = positive_ints("MlpEncoder", "input_dim", [input_dim], allow_empty=False)
        hidden_dims = positive_ints("MlpEncoder", "hidden_dims", hidden_dims, allow_empty=True)
        layers: list[nn.Module] = []
        width = input_dim
        for hidden in hidden_dims:
            # In place: a Linear layer's output is not kept for its backward, and ReLU's
            # backward reads its own output; fewer large temporaries per batch.
            act = nn.ReLU(inplace=True) if activation is nn.ReLU else activation()
            layers += [nn.Linear(width, hidden), act]
            width = hidden
        self.layers = nn.Sequential(*layers)
        self.input_dim = input_dim
        self.output_dim = width

    def forward(self, x: Tensor) -> Tensor:
        """Encodes ``(B, input_dim)`` inputs into ``(B, output_dim)`` features."""
        return self.layers(x)


class _ConvEncoder(nn.Module):
    """Shared body of the 1-D and 2-D convolutional encoders."""

    _conv: type[nn.Module]
    _spatial_dims: int
    _orthogonal: bool = False

    def __init__(
        self,
        *,
        input_shape: Sequence[int],
        channels: Sequence[int],
        kernels: Sequence[int],
        strides: Sequence[int] | None = None,
        padding: int = 0,
        channels_last: bool = True,
        activation: Activation = nn.ReLU,
        flatten: bool = True,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        input_shape = positive_ints(owner, "input_shape", input_shape, allow_empty=False)
        if len(input_shape) != self._spatial_dims + 1:
            raise ConfigurationError(
                f"{owner} takes observations of {self._spatial_dims + 1} dimensions (channels "
                f"and {self._spatial_dims} spatial); input_shape is {tuple(input_shape)}"
            )
        channels = positive_ints(owner, "channels", channels, allow_empty=False)
        kernels = positive_ints(owner, "kernels", kernels, allow_empty=False)
        strides = positive_ints(
            owner, "strides", strides if strides is not None else [1] * len(channels),
            allow_empty=False,
        )  # fmt: skip
        if not len(channels) == len(kernels) == len(strides):
            raise ConfigurationError(
                f"{owner} needs one kernel and stride per layer; got {len(channels)} channels, "
                f"{len(kernels)} kernels and {len(strides)} strides"
            )
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ConfigurationError(f"{owner}'s padding must be an integer >= 0; got {padding!r}")
        self.channels_last = channels_last
        self.input_shape = tuple(input_shape)
        """One observation's shape as given."""
        self.conv_input_shape = self._channels_first(self.input_shape)
        """One observation's shape as the convolutions see it: channels first."""
        in_channels = input_shape[-1] if channels_last else input_shape[0]
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in zip(channels, kernels, strides, strict=True):
            layers += [self._conv(in_channels, out_channels, kernel, stride, padding), activation()]
            in_channels = out_channels
        if flatten:
            layers.append(nn.Flatten())
        self.layers = nn.Sequential(*layers)
        if self._orthogonal:
            self.layers.apply(orthogonal_init_)
        too_small = ConfigurationError(
            f"{owner}: input_shape {self.input_shape} is too small for these kernels and strides "
            "(nothing is left of it); use smaller kernels or strides, or more padding"
        )
        try:
            with torch.no_grad():
                probe = self.layers(torch.zeros(1, *self.conv_input_shape))
        except RuntimeError as error:
            raise too_small from error
        if probe.numel() == 0:
            raise too_small
        self.output_shape = tuple(probe.shape[1:])
        """The shape of one output (one dimension when flattened)."""
        self.output_dim = int(probe[0].numel())
        """The number of features per input."""

    def _channels_first(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[-1], *shape[:-1]) if self.channels_last else shape

    def forward(self, x: Tensor) -> Tensor:
        """Encodes a batch of observations of ``input_shape``.

        Integer inputs (such as uint8 frames) are cast to float32 unscaled; scale them in the
        environment wrapper if needed.
        """
        if not x.is_floating_point():
            x = x.float()
        if self.channels_last:  # positive axes: ONNX exporters refuse a Transpose of axis -1
            x = x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))
        return self.layers(x)


class Conv1dEncoder(_ConvEncoder):
    """A stack of 1-D convolutions for sequences (such as ray casts or time windows).

    Args:
        input_shape: One observation's shape: ``(length, channels)`` when ``channels_last``,
            else ``(channels, length)``.
        channels: Output channels of each convolution.
        kernels: Kernel size of each convolution.
        strides: Stride of each convolution (all 1 when omitted).
        padding: Zero padding on each side, for every convolution.
        channels_last: Whether the channel dimension comes last in the input.
        activation: Builds the activation after each convolution.
        flatten: Flatten the output to ``(B, output_dim)``.

    Raises:
        ConfigurationError: If the layer settings disagree or leave no output.
    """

    _conv = nn.Conv1d
    _spatial_dims = 1


class Conv2dEncoder(_ConvEncoder):
    """A stack of 2-D convolutions for images, starting orthogonal (gain sqrt 2) as upstream's.

    Args:
        input_shape: One observation's shape: ``(height, width, channels)`` when
            ``channels_last`` (gymnasium's image layout), else ``(channels, height, width)``.
        channels: Output channels of each convolution.
        kernels: Kernel size of each convolution.
        strides: Stride of each convolution (all 1 when omitted).
        padding: Zero padding on each side, for every convolution.
        channels_last: Whether the channel dimension comes last in the input.
        activation: Builds the activation after each convolution.
        flatten: Flatten the output to ``(B, output_dim)``.

    Raises:
        ConfigurationError: If the layer settings disagree or leave no output.
    """

    _conv = nn.Conv2d
    _spatial_dims = 2
    _orthogonal = True  # upstream emote's Conv2dEncoder starts orthogonal; its Conv1dEncoder not


class ImageEncoder(nn.Module):
    """Images to a small, bounded feature vector: pixel scaling, :class:`Conv2dEncoder`, then a
    linear layer, layer normalisation and ``tanh`` (the encoder of pixel SAC and CURL).

    It takes a batch of channels-last images, ``(B, H, W, C)``, or the same batch flattened to
    ``(B, H * W * C)`` as :func:`~emote_core.nn.inputs.flatten_observation` hands it to networks;
    ``uint8`` pixels and floats alike are multiplied by ``scale`` (``1 / 255``: ``[0, 1]``).

    Args:
        image_shape: One image's ``(height, width, channels)``.
        channels: Output channels of each convolution.
        kernels: Kernel size of each convolution.
        strides: Stride of each convolution (all 1 when omitted).
        feature_dim: The width of the features.
        scale: Multiplies the pixels before the first convolution.

    Raises:
        ConfigurationError: If the settings disagree, leave no output, or ``feature_dim`` is not a
            positive integer.
    """

    def __init__(
        self,
        *,
        image_shape: Sequence[int],
        channels: Sequence[int] = (32, 32, 32, 32),
        kernels: Sequence[int] = (3, 3, 3, 3),
        strides: Sequence[int] | None = (2, 1, 1, 1),
        feature_dim: int = 50,
        scale: float = 1.0 / 255.0,
    ) -> None:
        super().__init__()
        (feature_dim,) = positive_ints(
            "ImageEncoder", "feature_dim", [feature_dim], allow_empty=False
        )
        self.conv = Conv2dEncoder(
            input_shape=image_shape, channels=channels, kernels=kernels, strides=strides,
            channels_last=True,
        )  # fmt: skip
        self.linear = nn.Linear(self.conv.output_dim, feature_dim)
        self.norm = nn.LayerNorm(feature_dim)
        self.image_shape = self.conv.input_shape
        self.scale = float(scale)
        self.output_dim = feature_dim
        """The width of the features."""

    def forward(self, images: Tensor) -> Tensor:
        """Encodes ``(B, H, W, C)`` images, or ``(B, H * W * C)`` flattened ones, into
        ``(B, feature_dim)`` features in ``(-1, 1)``.

        Raises:
            ConfigurationError: If the images have another shape, or are neither integers nor
                floats.
        """
        if images.dtype == torch.bool or images.is_complex():
            raise ConfigurationError(
                f"ImageEncoder takes uint8 or float pixels; got {images.dtype}"
            )
        flat = math.prod(self.image_shape)
        if images.dim() == 2 and images.shape[1] == flat:
            images = images.reshape(images.shape[0], *self.image_shape)
        elif tuple(images.shape[1:]) != self.image_shape:
            shape = ", ".join(map(str, self.image_shape))
            raise ConfigurationError(
                f"ImageEncoder takes images of shape (batch, {shape}) or (batch, {flat}); got "
                f"{tuple(images.shape)}"
            )
        features = self.conv(images.float() * self.scale)
        return torch.tanh(self.norm(self.linear(features)))


__all__ = ["Activation", "Conv1dEncoder", "Conv2dEncoder", "ImageEncoder", "MlpEncoder"]
