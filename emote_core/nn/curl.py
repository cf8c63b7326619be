"""CURL: contrastive representation learning for image encoders (Laskin et al., 2020).

An encoder that learns only from a reinforcement-learning loss sees a weak, noisy signal. CURL
adds an auxiliary task: two random augmentations of the same image must be recognised as a pair
among the other images of the batch. :class:`CurlLoss` trains the encoder on such pairs with
InfoNCE, the positives' codes coming from a momentum copy of the encoder; the augmentations are
an :class:`~emote_core.nn.augmentation.ImageAugmentor`'s (random cutout, optional noise).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional

from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.augmentation import ImageAugmentor, seeded_generator
from emote_core.schedules import BPStepScheduler
from emote_core.utils.checks import finite_number, positive_int
from emote_core.utils.random_state import capture, generators_of, restore


class _CurlNetworks(nn.Module):
    """Everything :class:`CurlLoss` trains or follows, so checkpoints hold it as one network."""

    def __init__(
        self,
        encoder: nn.Module,
        target_encoder: nn.Module,
        feature_dim: int,
        projection_dim: int | None,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.target_encoder = target_encoder
        code_dim = projection_dim or feature_dim
        if projection_dim is None:
            self.projection: nn.Module = nn.Identity()
        else:
            projection = nn.Linear(feature_dim, projection_dim)
            with torch.no_grad():
                nn.init.orthogonal_(projection.weight, generator=generator)
                projection.bias.zero_()
            self.projection = projection
        self.target_projection = copy.deepcopy(self.projection)
        # W starts as the identity: the first logits are plain dot products of the codes.
        self.bilinear = nn.Parameter(torch.eye(code_dim))


class CurlLoss(LossCallback):
    """Trains an image encoder contrastively (InfoNCE), as CURL does beside an RL loss.

    Two independent augmentations of each image go through the online encoder (anchors,
    ``z_a``) and the target encoder without gradients (positives, ``z_p``); the logits
    ``z_a[i]^T W z_p[j] / temperature`` are classified with cross-entropy, each anchor's own
    positive being the right class. After each step the targets move ``tau`` toward the online
    networks.

    Logs ``loss/<name>``, ``training/<name>_accuracy``, the learning rate and gradient norm, and
    with ``log_images`` ``images/<name>_anchor`` and ``images/<name>_positive``.

    Args:
        encoder: The online encoder, ``(B, H, W, C)`` images to ``(B, feature_dim)`` features;
            this loss trains it.
        observation_key: The observation entry holding the images.
        feature_dim: The width of the encoder's features.
        target_encoder: The momentum copy of the encoder (``None``: a deep copy); a given one
            must match its shapes, share none of its parameters, and starts from its weights.
        projection_dim: The width of a linear projection of the features to codes; ``None``
            uses the features as codes.
        temperature: Divides the logits; positive.
        tau: The fraction the target moves toward the online networks per step, in ``(0, 1]``.
        augmentor: Makes anchors and positives; ``None`` builds a default ``ImageAugmentor`` on
            the encoder's device, seeded with ``seed``.
        learning_rate: Adam's learning rate for the encoder, the projection and ``W``.
        lr_schedule: Multiplies ``learning_rate`` by ``lr_schedule.evaluate_at(k)`` after
            ``k`` updates.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        data_group: The data group whose ``observation`` is read.
        name: Unique name; keys logs and checkpoints.
        log_images: Record an anchor and its positive every ``image_log_interval`` updates.
        image_log_interval: How many updates apart images are recorded.
        seed: Seeds the projection's initial weights and the default augmentor.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If an argument is out of range, the encoder has no parameters or
            another feature width, or the target encoder does not match it.
    """

    compiled_methods: ClassVar[tuple[str, ...]] = ("contrastive_logits",)
    """Under ``training.compile``, the encoders and projections compile; the augmentations stay
    eager: they draw from the augmentor's own generator, which ``torch.compile`` cannot trace
    (compiled whole, the loss broke at each of those draws: 4 graph breaks an update)."""

    def __init__(
        self,
        *,
        encoder: nn.Module,
        observation_key: str,
        feature_dim: int,
        target_encoder: nn.Module | None = None,
        projection_dim: int | None = None,
        temperature: float = 1.0,
        tau: float = 0.05,
        augmentor: ImageAugmentor | None = None,
        learning_rate: float = 1e-3,
        lr_schedule: BPStepScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        data_group: str = "default",
        name: str = "curl",
        log_images: bool = False,
        image_log_interval: int = 1000,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        owner = f"CurlLoss '{name}'"
        self.temperature = finite_number(
            owner, "temperature", temperature, 0, math.inf, low_open=True
        )
        self.tau = finite_number(owner, "tau", tau, 0, 1, low_open=True)
        learning_rate = finite_number(
            owner, "learning_rate", learning_rate, 0, math.inf, low_open=True
        )
        feature_dim = positive_int(owner, "feature_dim", feature_dim)
        if projection_dim is not None:
            projection_dim = positive_int(owner, "projection_dim", projection_dim)
        self.image_log_interval = positive_int(owner, "image_log_interval", image_log_interval)
        if not isinstance(observation_key, str) or not observation_key:
            raise ConfigurationError(
                f"{owner}: observation_key must name the image entry; got {observation_key!r}"
            )
        if lr_schedule is not None and not isinstance(lr_schedule, BPStepScheduler):
            raise ConfigurationError(
                f"{owner}: lr_schedule must be an emote_core.schedules.BPStepScheduler or None; "
                f"got {type(lr_schedule).__name__}"
            )
        if augmentor is not None and not isinstance(augmentor, ImageAugmentor):
            raise ConfigurationError(
                f"{owner}: augmentor must be an ImageAugmentor or None; got "
                f"{type(augmentor).__name__}"
            )
        device = _encoder_device(owner, encoder, feature_dim)
        target_encoder = _prepare_target(owner, encoder, target_encoder)
        networks = _CurlNetworks(
            encoder,
            target_encoder,
            feature_dim,
            projection_dim,
            seeded_generator(torch.device("cpu"), seed),
        ).to(device)
        trained = [*encoder.parameters(), *networks.projection.parameters(), networks.bilinear]
        optimizer = torch.optim.Adam(trained, lr=learning_rate)
        schedule = None
        if lr_schedule is not None:
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule.evaluate_at)
        super().__init__(
            name=name,
            network=networks,
            optimizer=optimizer,
            lr_schedule=schedule,
            max_grad_norm=max_grad_norm,
            data_group=data_group,
            **kwargs,
        )
        for parameter in (*target_encoder.parameters(), *networks.target_projection.parameters()):
            parameter.requires_grad_(False)
        self.networks = networks
        self.observation_key = observation_key
        self.feature_dim = feature_dim
        if augmentor is None:
            augmentor = ImageAugmentor(seed=seed, device=device)
        self.augmentor = augmentor
        self.log_images = bool(log_images)
        self.updates = 0
        """How many optimisation steps this loss has taken (saved in checkpoints)."""
        online = [*encoder.parameters(), *networks.projection.parameters()]
        online_buffers = [*encoder.buffers(), *networks.projection.buffers()]
        followers = [*target_encoder.parameters(), *networks.target_projection.parameters()]
        follower_buffers = [*target_encoder.buffers(), *networks.target_projection.buffers()]
        self._pairs = list(zip(followers, online, strict=True))
        self._buffer_pairs = list(zip(follower_buffers, online_buffers, strict=True))

    @property
    def encoder(self) -> nn.Module:
        """The online encoder."""
        return self.networks.encoder

    @property
    def target_encoder(self) -> nn.Module:
        """The momentum copy of the encoder that makes the positives' codes."""
        return self.networks.target_encoder

    def contrastive_logits(self, anchors: Tensor, positives: Tensor) -> Tensor:
        """The ``(B, B)`` logits of anchor ``i`` against positive ``j``.

        ``z_a[i]^T W z_p[j] / temperature`` minus each row's maximum (which leaves the softmax as
        it is and keeps ``exp`` from overflowing); the positives' codes carry no gradient.

        Args:
            anchors: The anchor images, ``(B, H, W, C)``.
            positives: The positive images, ``(B, H, W, C)``, ``positives[i]`` pairing
                ``anchors[i]``.
        """
        anchor_codes = self.networks.projection(self._features(self.encoder, anchors))
        with torch.no_grad():
            features = self._features(self.target_encoder, positives)
            positive_codes = self.networks.target_projection(features)
        logits = anchor_codes @ (self.networks.bilinear @ positive_codes.T) / self.temperature
        return logits - logits.max(dim=1, keepdim=True).values.detach()

    def loss(self, observation: Mapping[str, Tensor]) -> Tensor:
        """InfoNCE over the batch: cross-entropy of :meth:`contrastive_logits` of two
        augmentations of the images, each row's label its own column."""
        images = self._images(observation)
        anchors, positives = self.augmentor(images), self.augmentor(images)
        logits = self.contrastive_logits(anchors, positives)
        labels = torch.arange(logits.shape[0], device=logits.device)
        accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
        self.log_scalar(f"training/{self.name}_accuracy", accuracy)
        if self.log_images and self.updates % self.image_log_interval == 0:
            self.log_image(f"images/{self.name}_anchor", _displayable(anchors[0]))
            self.log_image(f"images/{self.name}_positive", _displayable(positives[0]))
        return functional.cross_entropy(logits, labels)

    def backward(self, **state: Any) -> None:
        """One optimisation step (see :class:`LossCallback`), then the target follows."""
        super().backward(**state)
        with torch.no_grad():
            for follower, online in self._pairs:
                follower.lerp_(online, self.tau)
            for follower, online in self._buffer_pairs:
                follower.copy_(online)
        self.updates += 1

    def random_generators(self) -> dict[str, torch.Generator]:
        """The augmentor's generator, for checkpoints."""
        return generators_of(self.augmentor, "augmentor.")

    def state_dict(self) -> dict[str, Any]:
        """The networks (encoder, target, projections, ``W``), optimiser, schedule, augmentor
        generator, update count and logs."""
        state = super().state_dict()
        state["random_state"] = capture(self.random_generators())
        state["updates"] = self.updates
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores what :meth:`state_dict` saved, as the flags select (see
        :meth:`LossCallback.load_state_dict`); the generator and update count always."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if "random_state" in state_dict:
            restore(self.random_generators(), state_dict["random_state"], owner=self.name)
        self.updates = int(state_dict.get("updates", self.updates))

    def _images(self, observation: Mapping[str, Tensor]) -> Tensor:
        owner = f"CurlLoss '{self.name}'"
        if not isinstance(observation, Mapping):
            raise ConfigurationError(
                f"{owner}: observation must be a dict of entries; got {type(observation).__name__}"
            )
        if self.observation_key not in observation:
            raise ConfigurationError(
                f"{owner}: the observation has no entry '{self.observation_key}' (it has "
                f"{sorted(observation)}); set observation_key to the image entry"
            )
        images = observation[self.observation_key]
        if not isinstance(images, Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ConfigurationError(
                f"{owner}: observation '{self.observation_key}' must be (B, H, W, C) images; "
                f"got {shape}"
            )
        return images

    def _features(self, encoder: nn.Module, images: Tensor) -> Tensor:
        features = encoder(images)
        if features.dim() != 2 or features.shape[1] != self.feature_dim:
            raise ConfigurationError(
                f"CurlLoss '{self.name}': the encoder returned features of shape "
                f"{tuple(features.shape)}; feature_dim is {self.feature_dim} — set it to the "
                "encoder's output width"
            )
        return features


def _encoder_device(owner: str, encoder: nn.Module, feature_dim: int) -> torch.device:
    """The device of the encoder's parameters, after checking it has some and its width."""
    if not isinstance(encoder, nn.Module):
        raise ConfigurationError(f"{owner}: encoder must be a torch module; got {encoder!r}")
    parameters = list(encoder.parameters())
    if not parameters:
        raise ConfigurationError(
            f"{owner}: encoder {type(encoder).__name__} has no parameters to train; pass the "
            "image encoder itself"
        )
    output_dim = getattr(encoder, "output_dim", None)
    if isinstance(output_dim, int) and output_dim != feature_dim:
        raise ConfigurationError(
            f"{owner}: feature_dim is {feature_dim} but the encoder's output_dim is "
            f"{output_dim}; set feature_dim={output_dim}"
        )
    return parameters[0].device


def _prepare_target(owner: str, encoder: nn.Module, target: nn.Module | None) -> nn.Module:
    """A deep copy of ``encoder``, or ``target`` checked against it and set to its weights."""
    if target is None:
        return copy.deepcopy(encoder)
    online = dict(encoder.named_parameters())
    follower = dict(target.named_parameters())
    if target is encoder or {id(p) for p in follower.values()} & {id(p) for p in online.values()}:
        raise ConfigurationError(
            f"{owner}: target_encoder shares parameters with the encoder; pass a separate copy "
            "(copy.deepcopy(encoder)) or None"
        )
    online_shapes = {k: tuple(p.shape) for k, p in online.items()}
    target_shapes = {k: tuple(p.shape) for k, p in follower.items()}
    if online_shapes != target_shapes:
        raise ConfigurationError(
            f"{owner}: target_encoder's parameters {target_shapes} differ from the encoder's "
            f"{online_shapes}; build it as copy.deepcopy(encoder)"
        )
    with torch.no_grad():
        for key, parameter in follower.items():
            parameter.copy_(online[key])
    return target


def _displayable(image: Tensor) -> Tensor:
    """One ``(H, W, C)`` image as an image log takes it: the newest frame of a stack (the last
    3 channels, or the last one), floats scaled to ``[0, 1]``."""
    image = image.detach()
    channels = image.shape[-1]
    if channels not in (1, 3, 4):
        image = image[..., -3:] if channels % 3 == 0 else image[..., -1:]
    if image.dtype == torch.uint8:
        return image.cpu()
    image = image.float()
    low, high = image.min(), image.max()
    return ((image - low) / (high - low).clamp(min=1e-8)).cpu()


__all__ = ["CurlLoss", "ImageAugmentor"]
