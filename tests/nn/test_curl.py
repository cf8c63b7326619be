"""CurlLoss: the InfoNCE value and accuracy by hand, learning, the momentum target, image logs,
checkpoints and errors; and a step on CUDA."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from emote_core.callbacks.checkpointing import Checkpointer, CheckpointLoader, list_checkpoints
from emote_core.callbacks.compiled import compile_methods
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError, MissingStateKeyError
from emote_core.nn import Conv2dEncoder, CurlLoss, ImageAugmentor
from emote_core.schedules import LinearSchedule
from emote_core.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEY = "pixels"


class FlatEncoder(nn.Module):
    """Flattened pixels through one linear layer: features a test can compute by hand."""

    def __init__(self, image_shape: tuple[int, int, int], feature_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(image_shape), feature_dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.linear(images.reshape(images.shape[0], -1).float())


class ChannelMeanEncoder(nn.Module):
    """Each channel's mean pixel, through a linear layer that starts as the identity."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(channels, channels)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(channels))
            self.linear.bias.zero_()

    def forward(self, images: Tensor) -> Tensor:
        return self.linear(images.float().mean(dim=(1, 2)))


def conv_encoder(shape: tuple[int, int, int] = (16, 16, 3)) -> Conv2dEncoder:
    return Conv2dEncoder(input_shape=shape, channels=[16, 16], kernels=[3, 3], strides=[2, 2])


def make_curl(encoder: nn.Module | None = None, **kwargs) -> CurlLoss:
    encoder = encoder if encoder is not None else conv_encoder()
    arguments = {"seed": 0, "feature_dim": getattr(encoder, "output_dim", None)} | kwargs
    return CurlLoss(encoder=encoder, observation_key=KEY, **arguments)


def test_loss_is_infonce_of_two_augmentations_by_hand() -> None:
    torch.manual_seed(0)
    images = torch.rand(6, 4, 4, 2)
    encoder = FlatEncoder((4, 4, 2), 5)
    curl = make_curl(
        encoder, feature_dim=5, projection_dim=3, temperature=0.5,
        augmentor=ImageAugmentor(seed=11, noise_std=0.1),
    )  # fmt: skip
    # Give the target networks weights of their own, so the test tells them from the online ones.
    online = [encoder.linear, curl.networks.projection]
    target = [curl.target_encoder.linear, curl.networks.target_projection]
    bilinear = torch.randn(3, 3)
    with torch.no_grad():
        curl.networks.bilinear.copy_(bilinear)
        for layer in target:
            layer.weight.copy_(torch.randn_like(layer.weight))
            layer.bias.copy_(torch.randn_like(layer.bias))

    def codes(images: Tensor, layers: list[nn.Linear]) -> Tensor:
        features = images.reshape(images.shape[0], -1) @ layers[0].weight.T + layers[0].bias
        return (features @ layers[1].weight.T + layers[1].bias).detach()

    twin = ImageAugmentor(seed=11, noise_std=0.1)
    anchors, positives = twin(images), twin(images)  # the loss draws the anchors first
    anchor_codes, positive_codes = codes(anchors, online), codes(positives, target)
    logits = torch.empty(6, 6)
    for i in range(6):
        for j in range(6):
            logits[i, j] = anchor_codes[i] @ bilinear @ positive_codes[j] / 0.5
    expected = torch.stack([logits[i].logsumexp(0) - logits[i, i] for i in range(6)]).mean()

    loss = curl.loss(observation={KEY: images})
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    expected_accuracy = sum(int(logits[i].argmax() == i) for i in range(6)) / 6
    assert curl.scalar_logs["training/curl_accuracy"] == pytest.approx(expected_accuracy)


def test_logits_have_their_row_maximum_subtracted() -> None:
    curl = make_curl(temperature=0.1)
    images = torch.rand(8, 16, 16, 3)
    logits = curl.contrastive_logits(images, images)
    assert logits.shape == (8, 8)
    torch.testing.assert_close(logits.max(dim=1).values, torch.zeros(8))


@pytest.mark.parametrize(
    ("order", "accuracy"),
    [([0, 1, 2, 3], 1.0), ([0, 1, 3, 2], 0.5), ([1, 2, 3, 0], 0.0)],
)
def test_accuracy_is_the_share_of_rows_whose_argmax_is_the_diagonal(order, accuracy) -> None:
    # Image i is bright in channel i only, so codes are one-hot and W = a permutation matrix
    # decides which column wins each row.
    images = torch.zeros(4, 8, 8, 4)
    for i in range(4):
        images[i, ..., i] = 1.0
    curl = make_curl(ChannelMeanEncoder(4), feature_dim=4, learning_rate=1e-9)
    with torch.no_grad():
        curl.networks.bilinear.copy_(torch.eye(4)[order])
    curl.backward(observation={KEY: images})
    assert curl.scalar_logs["training/curl_accuracy"] == accuracy


def test_training_raises_contrastive_accuracy_and_lowers_the_loss() -> None:
    torch.manual_seed(0)
    curl = make_curl(projection_dim=32, learning_rate=1e-3)
    data = torch.Generator().manual_seed(1)
    held_out = torch.rand(16, 16, 16, 3, generator=data)  # never trained on

    def evaluate() -> tuple[float, float]:
        augmentor, labels = ImageAugmentor(seed=5), torch.arange(16)
        accuracies, losses = [], []
        with torch.no_grad():
            for _ in range(8):
                logits = curl.contrastive_logits(augmentor(held_out), augmentor(held_out))
                accuracies.append((logits.argmax(dim=1) == labels).float().mean().item())
                losses.append(nn.functional.cross_entropy(logits, labels).item())
        return sum(accuracies) / 8, sum(losses) / 8

    accuracy_before, loss_before = evaluate()
    for _ in range(40):
        # fresh random images each step: each is told apart from the others by its pixels
        curl.backward(observation={KEY: torch.rand(16, 16, 16, 3, generator=data)})
    accuracy_after, loss_after = evaluate()
    assert accuracy_after >= 0.8  # chance is 1/16
    assert accuracy_after > accuracy_before + 0.2
    assert loss_after < 0.5 * loss_before


def test_compiled_the_encoders_are_one_graph_and_steps_match_eager_ones(
    graph_counts: Callable[[], tuple[int, int]],
) -> None:
    data = torch.Generator().manual_seed(1)
    batches = [torch.rand(8, 16, 16, 3, generator=data) for _ in range(3)]
    torch.manual_seed(0)
    eager = make_curl(projection_dim=16)
    torch.manual_seed(0)
    compiled = make_curl(projection_dim=16)
    assert compile_methods([compiled], backend="aot_eager") == 1
    for batch in batches:
        eager.backward(observation={KEY: batch})
        compiled.backward(observation={KEY: batch})
    # The augmentations, drawn from the augmentor's own generator, stay out of the graph.
    assert graph_counts() == (1, 0)
    for a, b in zip(eager.encoder.parameters(), compiled.encoder.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert compiled.scalar_logs["loss/curl"] == pytest.approx(eager.scalar_logs["loss/curl"])


def test_target_encoder_moves_by_exactly_tau_toward_the_online_one() -> None:
    encoder = FlatEncoder((4, 4, 3), 6)
    curl = make_curl(encoder, feature_dim=6, projection_dim=3, tau=0.25, learning_rate=0.01)
    targets = [*curl.target_encoder.parameters(), *curl.networks.target_projection.parameters()]
    online = [*encoder.parameters(), *curl.networks.projection.parameters()]
    for target, source in zip(targets, online, strict=True):  # a target starts as a copy
        torch.testing.assert_close(target, source, rtol=0, atol=0)
        assert target is not source
    with torch.no_grad():
        for target in targets:
            target.zero_()
    batch = {KEY: torch.rand(8, 4, 4, 3)}

    curl.backward(observation=batch)
    for target, source in zip(targets, online, strict=True):
        # from zero, a quarter of the way to the online weights (taken after the update)
        torch.testing.assert_close(target, 0.25 * source.detach(), rtol=0, atol=0)
    previous = [target.clone() for target in targets]
    curl.backward(observation=batch)
    for target, before, source in zip(targets, previous, online, strict=True):
        assert not torch.equal(target, before)
        expected = 0.75 * before + 0.25 * source.detach()
        torch.testing.assert_close(target, expected, rtol=1e-6, atol=1e-7)


def test_the_target_gets_no_gradient_and_the_online_encoder_does() -> None:
    encoder = conv_encoder()
    curl = make_curl(encoder, projection_dim=8)
    curl.backward(observation={KEY: torch.rand(8, 16, 16, 3)})
    for parameter in [
        *curl.target_encoder.parameters(),
        *curl.networks.target_projection.parameters(),
    ]:
        assert parameter.grad is None and not parameter.requires_grad
    assert all(parameter.grad is not None for parameter in encoder.parameters())
    assert curl.networks.bilinear.grad is not None


def test_a_given_target_encoder_starts_as_a_copy_of_the_online_one() -> None:
    encoder, target = conv_encoder(), conv_encoder()
    curl = make_curl(encoder, target_encoder=target)
    assert curl.target_encoder is target
    for a, b in zip(target.parameters(), encoder.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_lr_schedule_multiplies_the_learning_rate() -> None:
    curl = make_curl(learning_rate=1e-3, lr_schedule=LinearSchedule(1.0, 0.5, 2))
    batch = {KEY: torch.rand(8, 16, 16, 3)}
    curl.backward(observation=batch)
    assert curl.scalar_logs["training/curl_lr"] == pytest.approx(0.75e-3)
    curl.backward(observation=batch)
    curl.backward(observation=batch)
    assert curl.scalar_logs["training/curl_lr"] == pytest.approx(0.5e-3)


def test_anchor_and_positive_images_are_logged_now_and_then() -> None:
    encoder = conv_encoder((24, 24, 9))
    curl = make_curl(
        encoder, log_images=True, image_log_interval=2, augmentor=ImageAugmentor(seed=3)
    )
    frames = torch.randint(0, 256, (8, 9, 24, 24), dtype=torch.uint8).movedim(1, -1)
    twin = ImageAugmentor(seed=3)
    anchors, positives = twin(frames), twin(frames)
    curl.backward(observation={KEY: frames})
    anchor = curl.image_logs.pop("images/curl_anchor")
    positive = curl.image_logs.pop("images/curl_positive")
    assert anchor.dtype == positive.dtype == np.uint8 and anchor.shape == (24, 24, 3)
    np.testing.assert_array_equal(anchor, anchors[0, ..., 6:].numpy())  # the newest frame
    np.testing.assert_array_equal(positive, positives[0, ..., 6:].numpy())
    curl.backward(observation={KEY: frames})
    assert not curl.image_logs
    curl.backward(observation={KEY: frames})
    assert set(curl.image_logs) == {"images/curl_anchor", "images/curl_positive"}


def curl_batches(steps: int, first_step: int = 0) -> Iterator[dict]:
    """Batch k depends only on k, so a resumed run sees what an uninterrupted one does."""
    for k in range(first_step, steps):
        stored = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(k))
        images = stored.movedim(1, -1)  # a channels-last view, as frame stacks are sampled
        yield {"batch_size": 8, "default": {"observation": {KEY: images}}}


def curl_run(run_dir: Path, steps: int, *, resume: bool, seed: int) -> CurlLoss:
    torch.manual_seed(seed)
    curl = make_curl(
        projection_dim=8, seed=seed, lr_schedule=LinearSchedule(1.0, 0.1, 10),
        augmentor=ImageAugmentor(seed=seed, noise_std=0.05),
    )  # fmt: skip
    callbacks = [
        curl,
        BackPropStepsTerminator(bp_steps=steps),
        Checkpointer(callbacks=[curl], run_dir=run_dir, checkpoint_interval=3),
    ]
    first_step = 0
    if resume:
        callbacks.append(CheckpointLoader(callbacks=[curl], run_dir=run_dir))
        first_step = list_checkpoints(run_dir)[-1][0]
    Trainer(callbacks, curl_batches(100, first_step)).train()
    return curl


def test_a_resumed_run_computes_the_same_losses_as_an_uninterrupted_one(tmp_path) -> None:
    straight = curl_run(tmp_path / "straight", 5, resume=False, seed=0)
    curl_run(tmp_path / "split", 3, resume=False, seed=0)
    # Everything the checkpoint holds must come from it: other weights, augmentations and W.
    resumed = curl_run(tmp_path / "split", 5, resume=True, seed=1)
    assert resumed.scalar_logs["loss/curl"] == straight.scalar_logs["loss/curl"]
    assert resumed.scalar_logs["training/curl_lr"] == straight.scalar_logs["training/curl_lr"]
    assert resumed.updates == straight.updates == 5
    for a, b in zip(straight.networks.parameters(), resumed.networks.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(
        straight.augmentor.generator.get_state(), resumed.augmentor.generator.get_state()
    )
    checkpoint = torch.load(tmp_path / "split" / "checkpoints" / "checkpoint_3.tar",
                            weights_only=True)  # fmt: skip
    saved = checkpoint["callbacks"]["curl"]["network_state_dict"]
    assert {"bilinear", "projection.weight", "target_projection.weight"} <= set(saved)
    assert any(key.startswith("target_encoder.") for key in saved)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"temperature": 0.0}, r"temperature must be in \(0, inf\]; got 0.0"),
        ({"temperature": -1.0}, r"temperature must be in \(0, inf\]; got -1.0"),
        ({"tau": 0.0}, r"tau must be in \(0, 1\]; got 0.0"),
        ({"tau": 1.5}, r"tau must be in \(0, 1\]; got 1.5"),
        ({"feature_dim": 7}, "feature_dim is 7 but the encoder's output_dim is 144"),
        ({"projection_dim": 0}, "projection_dim must be a positive integer; got 0"),
        ({"lr_schedule": 0.5}, "lr_schedule must be an emote_core.schedules.BPStepScheduler"),
    ],
)
def test_bad_loss_arguments_are_one_line_errors_naming_the_callback(arguments, message) -> None:
    with pytest.raises(ConfigurationError, match=message) as error:
        make_curl(name="pixels_curl", **arguments)
    assert str(error.value).startswith("CurlLoss 'pixels_curl': ")
    assert "\n" not in str(error.value)


def test_a_target_sharing_the_encoders_parameters_is_refused() -> None:
    encoder = conv_encoder()
    with pytest.raises(ConfigurationError, match="target_encoder shares parameters"):
        make_curl(encoder, target_encoder=encoder)
    with pytest.raises(ConfigurationError, match="target_encoder's parameters"):
        make_curl(encoder, target_encoder=conv_encoder((16, 16, 4)))


def test_missing_images_are_errors_naming_the_callback() -> None:
    curl = make_curl()
    with pytest.raises(ConfigurationError) as error:
        curl.backward(observation={"vector": torch.zeros(8, 3)})
    assert str(error.value) == (
        "CurlLoss 'curl': the observation has no entry 'pixels' (it has ['vector']); set "
        "observation_key to the image entry"
    )
    with pytest.raises(ConfigurationError, match=r"'pixels' must be \(B, H, W, C\) images"):
        curl.backward(observation={KEY: torch.zeros(8, 16, 16)})
    batches = [{"batch_size": 8, "default": {"actions": torch.zeros(8, 1)}}]
    with pytest.raises(MissingStateKeyError, match=r"callback 'curl' .* needs 'observation'"):
        Trainer([curl], iter(batches)).train()


def test_a_feature_width_that_does_not_match_is_an_error_at_the_first_batch() -> None:
    curl = make_curl(FlatEncoder((16, 16, 3), 6), feature_dim=5)
    with pytest.raises(ConfigurationError, match=r"features of shape \(8, 6\); feature_dim is 5"):
        curl.backward(observation={KEY: torch.rand(8, 16, 16, 3)})


@pytest.mark.gpu
def test_augmentation_and_a_loss_step_on_cuda() -> None:
    device = torch.device("cuda")
    frames = torch.randint(0, 256, (8, 9, 24, 24), dtype=torch.uint8, device=device)
    view = frames.movedim(1, -1)
    augmentor = ImageAugmentor(seed=0, noise_std=4.0, device=device)
    augmented = augmentor(view)
    assert augmented.device.type == "cuda" and augmented.dtype == torch.uint8
    assert augmented.shape == view.shape
    ones = torch.ones(8, 24, 24, 3, device=device)
    masked = (ImageAugmentor(device=device)(ones) == 0).all(dim=-1).sum(dim=(1, 2))
    assert masked.min() >= round(0.2 * 24) ** 2 and masked.max() <= round(0.4 * 24) ** 2

    encoder = conv_encoder((24, 24, 9)).to(device)
    curl = make_curl(encoder, projection_dim=16, log_images=True, image_log_interval=1)
    assert curl.augmentor.device.type == "cuda"
    before = [p.clone() for p in curl.target_encoder.parameters()]
    curl.backward(observation={KEY: view})  # uint8 frames, as a pixel table samples them
    assert math.isfinite(curl.scalar_logs["loss/curl"])
    assert any(
        not torch.equal(a, b) for a, b in zip(before, curl.target_encoder.parameters(), strict=True)
    )
    assert curl.state_dict()["random_state"]["augmentor.cutout"]["device"].startswith("cuda")
