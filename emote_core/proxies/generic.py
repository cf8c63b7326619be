"""GenericAgentProxy: one batched, gradient-free policy call for all acting agents.

The proxy stacks each input key over the acting agents, runs the policy once in eval mode under
``torch.no_grad()``, and splits each output back into one response per agent. Policies whose
``forward`` takes an ``epsilon`` argument (such as ``GaussianMlpPolicy``, which returns
``tanh(mean + std * epsilon)`` in eval mode) get standard-normal noise when acting
stochastically and zeros when acting deterministically.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.proxies.base import acting_agents, as_generator, inference_mode_of, key_names
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.typing import AgentId, DictObservation, DictResponse


class LogProbsDroppedWarning(UserWarning):
    """A proxy left without ``uses_logprobs`` dropped a policy's second output, as upstream's
    default did."""


ACTIONS_KEY = "actions"
"""The response key of the action an environment takes."""


def declared_noise_dim(policy: nn.Module) -> int | None:
    """The ``noise_dim`` a policy declares: the width of its ``epsilon`` when that is not the
    action's (a policy that chooses a latent and decodes it into the action, say)."""
    noise_dim = getattr(policy, "noise_dim", None)
    if isinstance(noise_dim, int) and not isinstance(noise_dim, bool) and noise_dim > 0:
        return noise_dim
    return None


def _takes_epsilon(policy: nn.Module) -> bool:
    try:
        parameters = inspect.signature(policy.forward).parameters
    except (TypeError, ValueError):  # builtins and scripted modules without a signature
        return False
    return "epsilon" in parameters


class GenericAgentProxy:
    """Acts for many agents with one policy call, by observation and response keys.

    Args:
        policy: The network; it is called as ``policy(*inputs)`` with one ``(B, ...)`` float32
            tensor per input key, in ``input_keys`` order (plus ``epsilon=`` when its ``forward``
            has that parameter), and returns one tensor per output key (a tensor, or a tuple
            in ``output_keys`` order).
        device: Where the policy runs.
        input_keys: The observation keys the policy reads.
        output_keys: The response keys its outputs are stored under (``"actions"`` is the one an
            environment acts with).
        spaces: When given, observations are checked against ``spaces.state``, actions cast to
            the action space's dtype, and the noise shaped like it.
        deterministic: For epsilon-taking policies, act with zero noise (the mean action).
        seed: Seeds the noise generator; ``None`` draws from fresh entropy.
        uses_logprobs: ``True``: the policy returns ``(actions, log_probs, *others)`` and the
            log-probabilities are dropped; ``False``: one tensor, stored under every output key;
            left out: one output per output key, except that a tuple with exactly one output
            more is read as upstream's default ``True`` did (its second dropped), with a
            :class:`LogProbsDroppedWarning` at the first call.

    Raises:
        ConfigurationError: If keys are malformed or absent from ``spaces``, or the policy takes
            ``epsilon`` and the action shape is unknown (pass ``spaces``, or give the policy an
            ``action_dim`` attribute).
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        device: torch.device | str,
        input_keys: Sequence[str],
        output_keys: Sequence[str],
        spaces: MDPSpace | None = None,
        deterministic: bool = False,
        seed: int | None = None,
        uses_logprobs: bool | None = None,
    ) -> None:
        owner = type(self).__name__
        if uses_logprobs is not None and not isinstance(uses_logprobs, bool):
            raise ConfigurationError(
                f"{owner}: uses_logprobs must be True, False or left out; got {uses_logprobs!r}"
            )
        self.uses_logprobs = uses_logprobs
        self._warned_dropped = False
        self.policy = policy
        self.device = torch.device(device)
        self._input_keys = key_names(owner, "input_keys", input_keys)
        self._output_keys = key_names(owner, "output_keys", output_keys)
        self.spaces = spaces
        self.deterministic = bool(deterministic)
        self._generator = as_generator(seed)
        self._expected_shapes: dict[str, tuple[int, ...]] = {}
        if spaces is not None:
            available = spaces.state.keys()
            missing = [k for k in self._input_keys if k not in available]
            if missing:
                raise ConfigurationError(
                    f"{owner}: input keys {missing} are not in the observation space, which has "
                    f"keys {sorted(available)}; fix input_keys"
                )
            self._expected_shapes = {k: spaces.state[k].shape for k in self._input_keys}
        self._takes_epsilon = _takes_epsilon(policy)
        self._noise_shape: tuple[int, ...] | None = None
        if self._takes_epsilon:
            self._noise_shape = self._find_noise_shape(owner)

    def random_generators(self) -> dict[str, torch.Generator]:
        """Its sampling noise, for checkpoints."""
        return {"noise": self._generator}

    def _find_noise_shape(self, owner: str) -> tuple[int, ...]:
        noise_dim = declared_noise_dim(self.policy)
        if noise_dim is not None:
            return (noise_dim,)
        if self.spaces is not None:
            return tuple(self.spaces.actions.shape)
        action_dim = getattr(self.policy, "action_dim", None)
        if isinstance(action_dim, int) and not isinstance(action_dim, bool) and action_dim > 0:
            return (action_dim,)
        raise ConfigurationError(
            f"{owner}: the policy's forward takes 'epsilon', so the proxy draws noise of the "
            "action's shape, which it cannot tell — pass spaces=..., or give the policy an "
            "integer 'action_dim' attribute"
        )

    @property
    def input_names(self) -> tuple[str, ...]:
        """The observation keys the policy reads."""
        return self._input_keys

    @property
    def output_names(self) -> tuple[str, ...]:
        """The response keys the proxy fills."""
        return self._output_keys

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Responds to every ``INITIAL`` and ``RUNNING`` observation.

        Raises:
            ConfigurationError: If an observation lacks an input key or (with ``spaces``) has the
                wrong shape, or the policy's outputs do not match ``output_keys``.
        """
        agents = acting_agents(observations)
        if not agents:
            return {}
        batches = {key: self._stack(key, agents, observations) for key in self._input_keys}
        arrays = self._act(batches, len(agents))
        return {
            agent: DictResponse(list_data={key: arrays[key][row] for key in self._output_keys})
            for row, agent in enumerate(agents)
        }

    def act_batch(self, observations: Mapping[str, np.ndarray]) -> np.ndarray:
        """The ``"actions"`` output for a batch: ``{key: (B, ...)}`` in, ``(B, ...)`` out.

        Acts exactly as :meth:`__call__` on the same rows would (the same noise draws).

        Raises:
            ConfigurationError: If an input key is missing or (with ``spaces``) a row has the
                wrong shape, or the policy has no ``"actions"`` output.
        """
        if ACTIONS_KEY not in self._output_keys:
            raise ConfigurationError(
                f"{type(self).__name__}.act_batch returns '{ACTIONS_KEY}'; this proxy's outputs "
                f"are {list(self._output_keys)}"
            )
        batches = {}
        for key in self._input_keys:
            if key not in observations:
                raise ConfigurationError(
                    f"{type(self).__name__}: the observations have no '{key}' (they have "
                    f"{sorted(observations)}); the policy reads {list(self._input_keys)}"
                )
            batch = np.asarray(observations[key])
            expected = self._expected_shapes.get(key)
            if expected is not None and batch.shape[1:] != expected:
                raise ConfigurationError(
                    f"{type(self).__name__}: observation '{key}' has rows of shape "
                    f"{batch.shape[1:]}; the observation space says {expected}"
                )
            batches[key] = self._prepare(key, batch)
        count = len(next(iter(observations.values())))
        return self._act(batches, count)[ACTIONS_KEY]

    def _act(self, batches: dict[str, torch.Tensor], count: int) -> dict[str, np.ndarray]:
        inputs = self._inputs(batches)
        with inference_mode_of(self.policy):
            if self._takes_epsilon:
                outputs = self.policy(*inputs, epsilon=self._noise(count))
            else:
                outputs = self.policy(*inputs)
        return self._outputs(outputs, count)

    # Steps subclasses adapt.

    def _prepare(self, key: str, batch: np.ndarray) -> torch.Tensor:
        """One input key's ``(B, ...)`` batch as the tensor the policy takes."""
        return torch.as_tensor(batch, dtype=torch.float32, device=self.device)

    def _inputs(self, batches: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The policy's positional inputs from the prepared batches, by key."""
        return [batches[key] for key in self._input_keys]

    # Internals.

    def _stack(
        self, key: str, agents: list[AgentId], observations: Mapping[AgentId, DictObservation]
    ) -> torch.Tensor:
        rows = []
        expected = self._expected_shapes.get(key)
        for agent in agents:
            data = observations[agent].array_data
            value = data.get(key)
            if value is None:
                raise ConfigurationError(
                    f"{type(self).__name__}: the observation of agent {agent} has no '{key}' "
                    f"(it has {sorted(data)}); the policy reads {list(self._input_keys)}"
                )
            value = np.asarray(value)
            if expected is not None and value.shape != expected:
                raise ConfigurationError(
                    f"{type(self).__name__}: observation '{key}' of agent {agent} has shape "
                    f"{value.shape}; the observation space says {expected}"
                )
            rows.append(value)
        return self._prepare(key, np.stack(rows))

    def _noise(self, count: int) -> torch.Tensor:
        shape = (count, *(self._noise_shape or ()))
        if self.deterministic:
            return torch.zeros(shape, device=self.device)
        return torch.randn(shape, generator=self._generator).to(self.device)

    def _outputs(self, outputs: Any, count: int) -> dict[str, np.ndarray]:
        outputs = self._select_outputs(outputs)
        arrays = {}
        for key, output in zip(self._output_keys, outputs, strict=True):
            array = torch.as_tensor(output).detach().cpu().numpy()
            if array.ndim == 1:
                array = array[:, None]
            if array.shape[0] != count:
                raise ConfigurationError(
                    f"{type(self).__name__}: policy output '{key}' has shape {array.shape}; "
                    f"expected a leading batch dimension of {count}"
                )
            arrays[key] = self._cast(key, array)
        return arrays

    def _select_outputs(self, outputs: Any) -> tuple[Any, ...]:
        """The policy's outputs, one per output key, read as ``uses_logprobs`` says."""
        owner, keys = type(self).__name__, list(self._output_keys)
        is_sequence = isinstance(outputs, tuple | list)
        if self.uses_logprobs is False:
            if is_sequence:
                raise ConfigurationError(
                    f"{owner}: with uses_logprobs=False the policy must return one tensor (stored "
                    f"under every output key {keys}); it returned {len(outputs)} outputs — pass "
                    "uses_logprobs=True if the second is log-probabilities"
                )
            return (outputs,) * len(keys)
        if self.uses_logprobs is True:
            if not is_sequence or len(outputs) < 2:
                got = f"{len(outputs)} output" if is_sequence else type(outputs).__name__
                raise ConfigurationError(
                    f"{owner}: with uses_logprobs=True the policy must return (actions, "
                    f"log_probs, ...) and the log-probabilities are dropped; it returned {got} "
                    "in eval mode — emote's policies return only actions there: leave "
                    "uses_logprobs out"
                )
            outputs = (outputs[0], *outputs[2:])
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        if not isinstance(outputs, tuple | list) or len(outputs) != len(keys):
            got = (
                f"{len(outputs)} outputs"
                if isinstance(outputs, tuple | list)
                else type(outputs).__name__
            )
            one_extra = isinstance(outputs, tuple | list) and len(outputs) == len(keys) + 1
            if self.uses_logprobs is None and one_extra:
                return self._drop_second(outputs, owner, keys)
            raise ConfigurationError(
                f"{owner}: the policy returned {got} in eval mode; the proxy expects one "
                f"tensor per output key {keys}"
            )
        return tuple(outputs)

    def _drop_second(self, outputs: Any, owner: str, keys: list[str]) -> tuple[Any, ...]:
        """Upstream's default reading: the second of one output too many is log-probabilities."""
        if not self._warned_dropped:
            self._warned_dropped = True
            warnings.warn(
                f"{owner}: the policy returned {len(outputs)} outputs for output keys {keys}; the "
                "second is taken for log-probabilities and dropped, as upstream emote's default "
                "did — pass uses_logprobs=True to say so, or return one output per key",
                LogProbsDroppedWarning,
                stacklevel=6,  # the caller of __call__ or act_batch
            )
        return (outputs[0], *outputs[2:])

    def _cast(self, key: str, array: np.ndarray) -> np.ndarray:
        if self.spaces is None or key != ACTIONS_KEY:
            return array
        space = self.spaces.actions
        if isinstance(space, DiscreteSpace):
            if array.shape[1:] != (1,):
                raise ConfigurationError(
                    f"{type(self).__name__}: for a discrete action space the policy must return "
                    f"one action index per agent; it returned shape {array.shape} — use "
                    "EpsilonGreedyAgentProxy for a network that returns one value per action"
                )
            return np.rint(array).astype(np.int64)
        return array.astype(space.dtype, copy=False)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(inputs={list(self._input_keys)}, "
            f"outputs={list(self._output_keys)}, deterministic={self.deterministic})"
        )


class FeatureAgentProxy(GenericAgentProxy):
    """A policy reading one flat feature vector and returning ``"actions"``.

    Args:
        policy: The network, ``policy(obs)`` or ``policy(obs, epsilon)`` (see
            :class:`GenericAgentProxy`).
        device: Where the policy runs.
        input_key: The observation key of the feature vector.
        deterministic: Act with zero noise.
        spaces: The MDP space to validate observations and cast actions with.
        seed: Seeds the noise generator.
        uses_logprobs: How to read a policy that returns a tuple (see
            :class:`GenericAgentProxy`).
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        device: torch.device | str,
        input_key: str = "obs",
        deterministic: bool = False,
        spaces: MDPSpace | None = None,
        seed: int | None = None,
        uses_logprobs: bool | None = None,
    ) -> None:
        super().__init__(
            policy=policy,
            device=device,
            input_keys=[input_key],
            output_keys=[ACTIONS_KEY],
            spaces=spaces,
            deterministic=deterministic,
            seed=seed,
            uses_logprobs=uses_logprobs,
        )


__all__ = [
    "ACTIONS_KEY",
    "FeatureAgentProxy",
    "GenericAgentProxy",
    "LogProbsDroppedWarning",
    "declared_noise_dim",
]
