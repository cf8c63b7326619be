"""The networks of a dynamics model: an ensemble of Gaussian MLPs (MBPO's) and a single
deterministic MLP with the same interface.

Both map a normalised model input (observation features and action) to a normalised target
(observation delta and reward). The members of an ensemble are independent MLPs whose layers are
stacked into :class:`~emote_core.models.layers.EnsembleLinearLayer`, so all members run in one
batched matmul.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.models.layers import (
    EnsembleLinearLayer,
    activation_class,
    truncated_normal_init,
)
from emote_core.utils.checks import positive_int


class _MemberNetwork(nn.Module):
    """What both networks share: the elite members, per-member errors and the switch that turns
    sampling noise off."""

    elites: Tensor

    def __init__(self, *, owner: str, in_size: int, out_size: int, ensemble_size: int) -> None:
        super().__init__()
        self._owner = owner
        self.in_size = positive_int(owner, "in_size", in_size)
        self.out_size = positive_int(owner, "out_size", out_size)
        self.ensemble_size = positive_int(owner, "ensemble_size", ensemble_size)
        self._has_variance = False
        self._deterministic = True

    def _register_elites(self, num_elites: int) -> None:
        if (
            isinstance(num_elites, bool)
            or not isinstance(num_elites, int)
            or not 1 <= num_elites <= self.ensemble_size
        ):
            raise ConfigurationError(
                f"{self._owner}'s num_elites must be between 1 and ensemble_size "
                f"({self.ensemble_size}); got {num_elites!r} — keep at most as many elites as "
                "members"
            )
        self.num_elites = num_elites
        # A buffer, so the chosen elites are saved with the weights they were chosen for.
        self.register_buffer("elites", torch.arange(num_elites))

    @property
    def deterministic(self) -> bool:
        """Whether :meth:`sample` returns the chosen member's mean without noise. A network built
        with a variance head may switch it on and off; one built without stays ``True``."""
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        if not value and not self._has_variance:
            raise ConfigurationError(
                f"{self._owner} predicts no variance, so it cannot sample with noise; got "
                "deterministic=False — build an EnsembleOfGaussian with deterministic=False"
            )
        self._deterministic = bool(value)

    def _check_batch(self, model_in: Tensor, target: Tensor) -> None:
        if (
            model_in.dim() != 2
            or target.dim() != 2
            or model_in.shape[0] != target.shape[0]
            or model_in.shape[0] == 0
            or model_in.shape[1] != self.in_size
            or target.shape[1] != self.out_size
        ):
            raise ConfigurationError(
                f"{self._owner} takes model inputs (B, {self.in_size}) and targets "
                f"(B, {self.out_size}) with the same B >= 1; got {tuple(model_in.shape)} and "
                f"{tuple(target.shape)}"
            )

    def loss(
        self, model_in: Tensor, target: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss of a batch: :meth:`member_loss` of the rows :meth:`bootstrap` gives
        each member.

        Args:
            model_in: ``(B, in_size)``, normalised.
            target: ``(B, out_size)``, normalised.
            generator: The CPU generator of the bootstrap.

        Returns:
            The scalar loss and its detached statistics (``"mse"``, ...).

        Raises:
            ConfigurationError: If the shapes do not match the network.
        """
        return self.member_loss(*self.bootstrap(model_in, target, generator=generator))

    def member_mse(self, model_in: Tensor, target: Tensor) -> Tensor:
        """Each member's mean squared error of its mean prediction on the same rows (no
        bootstrap), averaged over rows and dimensions; for choosing elites and held-out checks.

        Args:
            model_in: ``(B, in_size)``.
            target: ``(B, out_size)``.

        Returns:
            ``(ensemble_size,)``, without gradient.
        """
        self._check_batch(model_in, target)
        with torch.no_grad():
            mean, _ = self(model_in)
            return (mean - target).square().mean(dim=(1, 2))

    def set_elites(self, scores: Tensor) -> None:
        """Keeps the ``num_elites`` members with the lowest ``scores``, best first.

        Args:
            scores: ``(ensemble_size,)``, lower is better (e.g. :meth:`member_mse` on held-out
                rows). NaN scores sort last.

        Raises:
            ConfigurationError: If ``scores`` has another shape.
        """
        if tuple(scores.shape) != (self.ensemble_size,):
            raise ConfigurationError(
                f"{self._owner}.set_elites takes one score per member, shape "
                f"({self.ensemble_size},); got {tuple(scores.shape)}"
            )
        order = torch.argsort(scores.detach(), stable=True)[: self.num_elites]
        self.elites.copy_(order.to(self.elites.device))


def _squared_error_loss(mean: Tensor, target: Tensor) -> Tensor:
    """``0.5 * sum over dims of (mean - target)^2``, averaged over rows and summed over members:
    the Gaussian NLL with unit variance, less its constant."""
    return 0.5 * (mean - target).square().sum(dim=-1).mean(dim=-1).sum()


class EnsembleOfGaussian(_MemberNetwork):
    """An ensemble of MLPs, each predicting a diagonal Gaussian over the target (MBPO's model).

    Each member outputs a mean and a log-variance softly bounded (softplus) between learned
    ``min_logvar`` and ``max_logvar``. :meth:`loss` trains each member on its own bootstrap of
    the batch; :meth:`sample` draws from one elite member per row.

    Args:
        in_size: The width of a model input.
        out_size: The width of a target.
        ensemble_size: The number of members.
        num_elites: How many members :meth:`sample` draws from (see :meth:`set_elites`).
        hidden_size: The width of each hidden layer.
        num_layers: The number of hidden layers.
        activation: One of ``"silu"``, ``"relu"``, ``"tanh"``, ``"elu"``.
        deterministic: Build without a variance head: ``forward`` returns no log-variance,
            :meth:`loss` is the squared error and :meth:`sample` adds no noise.
        logvar_penalty: The weight of ``sum(max_logvar) - sum(min_logvar)`` in the loss.
        generator: The CPU generator the initial weights are drawn with.
        device: Where the parameters live (they are initialised on the CPU, then moved).

    Raises:
        ConfigurationError: If a size is not a positive integer, ``num_elites`` is not in
            ``[1, ensemble_size]``, the activation is unknown or ``logvar_penalty`` is negative.
    """

    max_logvar: nn.Parameter | None
    min_logvar: nn.Parameter | None

    def __init__(
        self,
        *,
        in_size: int,
        out_size: int,
        ensemble_size: int = 7,
        num_elites: int = 5,
        hidden_size: int = 200,
        num_layers: int = 4,
        activation: str = "silu",
        deterministic: bool = False,
        logvar_penalty: float = 0.01,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        owner = "EnsembleOfGaussian"
        super().__init__(
            owner=owner, in_size=in_size, out_size=out_size, ensemble_size=ensemble_size
        )
        self._register_elites(num_elites)
        positive_int(owner, "hidden_size", hidden_size)
        positive_int(owner, "num_layers", num_layers)
        activation_type = activation_class(owner, activation)
        if not (math.isfinite(logvar_penalty) and logvar_penalty >= 0.0):
            raise ConfigurationError(
                f"{owner}'s logvar_penalty must be 0 or more; got {logvar_penalty}"
            )
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.activation = activation
        self.logvar_penalty = float(logvar_penalty)
        layers: list[nn.Module] = []
        width = in_size
        for _ in range(num_layers):
            layers += [
                EnsembleLinearLayer(width, hidden_size, ensemble_size, generator=generator),
                activation_type(),
            ]
            width = hidden_size
        self.hidden = nn.Sequential(*layers)
        self._has_variance = not deterministic
        self._deterministic = bool(deterministic)
        head_width = out_size if deterministic else 2 * out_size
        self.output = EnsembleLinearLayer(width, head_width, ensemble_size, generator=generator)
        if deterministic:
            self.register_parameter("max_logvar", None)
            self.register_parameter("min_logvar", None)
        else:
            self.max_logvar = nn.Parameter(torch.full((1, 1, out_size), 0.5))
            self.min_logvar = nn.Parameter(torch.full((1, 1, out_size), -10.0))
        self.to(device)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Every member's prediction.

        Args:
            x: ``(B, in_size)``, the same rows for every member, or
                ``(ensemble_size, B, in_size)``.

        Returns:
            The mean and the bounded log-variance, each ``(ensemble_size, B, out_size)``; the
            log-variance is ``None`` when built deterministic.
        """
        out = self.output(self.hidden(x))
        mean = out[..., : self.out_size]
        if self.max_logvar is None or self.min_logvar is None:
            return mean, None
        logvar = out[..., self.out_size :]
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar

    def bootstrap(
        self, model_in: Tensor, target: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Each member's own bootstrap of the batch: ``B`` rows drawn with replacement from the
        ``B`` given, ``(ensemble_size, B, in_size)`` and ``(ensemble_size, B, out_size)``.

        The draw is apart from :meth:`member_loss` so that a compiled loss need not trace a
        generator of its own.

        Args:
            model_in: ``(B, in_size)``, normalised.
            target: ``(B, out_size)``, normalised.
            generator: The CPU generator the bootstrap indices are drawn with.

        Raises:
            ConfigurationError: If the shapes do not match the network.
        """
        self._check_batch(model_in, target)
        rows = model_in.shape[0]
        index = torch.randint(rows, (self.ensemble_size, rows), generator=generator)
        index = index.to(model_in.device)
        return model_in[index], target[index]

    def member_loss(
        self, member_in: Tensor, member_target: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss of each member's rows (as :meth:`bootstrap` gives them).

        Member ``e``'s Gaussian NLL is ``0.5 * mean over rows of sum over dims of
        ((mean - target)^2 exp(-logvar) + logvar)`` (without the constant); the loss is the sum
        over members plus ``logvar_penalty * (sum(max_logvar) - sum(min_logvar))``. Built
        deterministic, the NLL is replaced by ``0.5 * mean over rows of sum over dims of
        (mean - target)^2`` and there is no penalty.

        Args:
            member_in: ``(ensemble_size, B, in_size)``.
            member_target: ``(ensemble_size, B, out_size)``.

        Returns:
            The scalar loss and, detached, ``"mse"`` (the squared error of the means averaged
            over members, rows and dims) and, with a variance head, ``"mean_logvar"``.
        """
        mean, logvar = self(member_in)
        squared = (mean - member_target).square()
        info = {"mse": squared.mean().detach()}
        if logvar is None or self.max_logvar is None or self.min_logvar is None:
            return _squared_error_loss(mean, member_target), info
        nll = 0.5 * (squared * torch.exp(-logvar) + logvar).sum(dim=-1).mean(dim=-1)
        bounds = self.max_logvar.sum() - self.min_logvar.sum()
        info["mean_logvar"] = logvar.mean().detach()
        return nll.sum() + self.logvar_penalty * bounds, info

    def sample(self, model_in: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One prediction per row, each from an elite member drawn uniformly for that row: its
        mean plus, unless :attr:`deterministic`, ``exp(0.5 logvar)`` times standard normal noise.

        Args:
            model_in: ``(B, in_size)``, normalised.
            generator: The CPU generator the members and the noise are drawn with.

        Returns:
            ``(B, out_size)``, without gradient.
        """
        with torch.no_grad():
            mean, logvar = self(model_in)
            rows = model_in.shape[0]
            choice = torch.randint(self.num_elites, (rows,), generator=generator)
            members = self.elites[choice.to(self.elites.device)]
            row_index = torch.arange(rows, device=mean.device)
            picked = mean[members, row_index]
            if self.deterministic or logvar is None:
                return picked
            noise = torch.randn((rows, self.out_size), generator=generator, dtype=mean.dtype)
            return picked + torch.exp(0.5 * logvar[members, row_index]) * noise.to(mean.device)

    def extra_repr(self) -> str:
        return (
            f"ensemble_size={self.ensemble_size}, num_elites={self.num_elites}, "
            f"deterministic={self.deterministic}, logvar_penalty={self.logvar_penalty}"
        )


class DeterministicModel(_MemberNetwork):
    """One MLP predicting the target, with the ensemble's interface as an ensemble of one.

    ``forward`` returns ``(mean (1, B, out_size), None)``; :meth:`loss` is ``0.5 * mean over
    rows of sum over dims of (mean - target)^2`` on the batch as given (no bootstrap);
    :meth:`sample` is the prediction. ``ensemble_size`` and ``num_elites`` are 1 and
    ``deterministic`` is ``True``.

    Args:
        in_size: The width of a model input.
        out_size: The width of a target.
        hidden_size: The width of each hidden layer.
        num_layers: The number of hidden layers.
        activation: One of ``"silu"``, ``"relu"``, ``"tanh"``, ``"elu"``.
        generator: The CPU generator the truncated-normal initial weights are drawn with.
        device: Where the parameters live (they are initialised on the CPU, then moved).

    Raises:
        ConfigurationError: If a size is not a positive integer or the activation is unknown.
    """

    def __init__(
        self,
        *,
        in_size: int,
        out_size: int,
        hidden_size: int = 200,
        num_layers: int = 4,
        activation: str = "silu",
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        owner = "DeterministicModel"
        super().__init__(owner=owner, in_size=in_size, out_size=out_size, ensemble_size=1)
        self._register_elites(1)
        positive_int(owner, "hidden_size", hidden_size)
        positive_int(owner, "num_layers", num_layers)
        activation_type = activation_class(owner, activation)
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.activation = activation
        layers: list[nn.Module] = []
        width = in_size
        for _ in range(num_layers):
            # skip_init: the weights are drawn below with the generator, not torch's global one.
            layers += [nn.utils.skip_init(nn.Linear, width, hidden_size), activation_type()]
            width = hidden_size
        layers.append(nn.utils.skip_init(nn.Linear, width, out_size))
        self.layers = nn.Sequential(*layers)
        truncated_normal_init(self, generator=generator)
        self.to(device)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """The prediction as an ensemble of one.

        Args:
            x: ``(B, in_size)`` or ``(1, B, in_size)``.

        Returns:
            ``(1, B, out_size)`` and ``None``.

        Raises:
            ConfigurationError: If ``x`` has another shape.
        """
        if x.dim() == 2 and x.shape[1] == self.in_size:
            x = x.unsqueeze(0)
        elif not (x.dim() == 3 and x.shape[0] == 1 and x.shape[2] == self.in_size):
            raise ConfigurationError(
                f"DeterministicModel takes inputs of shape (B, {self.in_size}) or "
                f"(1, B, {self.in_size}); got {tuple(x.shape)}"
            )
        return self.layers(x), None

    def bootstrap(
        self, model_in: Tensor, target: Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """The batch as given, as the rows of an ensemble of one: ``(1, B, in_size)`` and
        ``(1, B, out_size)`` (one network needs no bootstrap; ``generator`` is unused).

        Raises:
            ConfigurationError: If the shapes do not match the network.
        """
        del generator
        self._check_batch(model_in, target)
        return model_in.unsqueeze(0), target.unsqueeze(0)

    def member_loss(
        self, member_in: Tensor, member_target: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``0.5 * mean over rows of sum over dims of (prediction - target)^2``.

        Args:
            member_in: ``(1, B, in_size)``.
            member_target: ``(1, B, out_size)``.

        Returns:
            The scalar loss and ``{"mse": ...}``, the squared error averaged over rows and dims.
        """
        mean, _ = self(member_in)
        error = (mean - member_target).square()
        return _squared_error_loss(mean, member_target), {"mse": error.mean().detach()}

    def sample(self, model_in: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The prediction, ``(B, out_size)``, without gradient; ``generator`` is unused."""
        del generator
        with torch.no_grad():
            return self(model_in)[0][0]


__all__ = ["DeterministicModel", "EnsembleOfGaussian"]
