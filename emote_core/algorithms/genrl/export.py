"""The acting module of GenRL as one exportable network: observations and noise in, environment
actions out, with the latent policy and the frozen decoder chained inside.

:class:`LatentPolicyActing` takes one tensor per observation key, then ``epsilon`` of the
*latent* width (the policy's noise, not the environment action's), and returns
:class:`~emote_core.algorithms.genrl.wrappers.PolicyWrapper`'s actions: the decoder of
``latent_scale * tanh(mean + std * epsilon)``. :func:`latent_policy_graph` snapshots it into a
:class:`~emote_core.onnx.graph.PolicyGraph` that :func:`~emote_core.onnx.writer.write_policy`
writes and checks like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from emote_core.algorithms.genrl.wrappers import PolicyWrapper
from emote_core.errors import ConfigurationError, ExportError
from emote_core.onnx.format import ACTIONS_OUTPUT, EPSILON_INPUT
from emote_core.onnx.graph import KeyedInputs, PolicyGraph, policy_graph
from emote_core.spaces import MDPSpace

GENRL_ALGORITHM = "genrl"
"""The algorithm name an export records unless told another."""


class LatentPolicyActing(KeyedInputs):
    """``(*observations, epsilon) -> actions`` through the latent policy and the frozen decoder.

    Args:
        policy_wrapper: The latent policy with its decoder and ``latent_scale``.
        keys: The observation keys, in input order (flattened as the agent proxies do).

    Raises:
        ConfigurationError: If ``policy_wrapper`` is not a :class:`PolicyWrapper`.
    """

    def __init__(self, policy_wrapper: PolicyWrapper, keys: Sequence[str]) -> None:
        if not isinstance(policy_wrapper, PolicyWrapper):
            raise ConfigurationError(
                f"LatentPolicyActing exports a PolicyWrapper (policy, decoder and latent_scale); "
                f"got {type(policy_wrapper).__name__}"
            )
        super().__init__(keys)
        self.policy_wrapper = policy_wrapper
        self.latent_dim = policy_wrapper.latent_dim

    def forward(self, *inputs: Tensor) -> Tensor:
        """The ``(B, action_dim)`` environment actions; the last input is ``epsilon``, ``(B,
        latent_dim)`` (zeros: the deterministic action)."""
        *observations, epsilon = inputs
        return self.policy_wrapper(self.features(observations), epsilon)


def latent_policy_graph(
    policy_wrapper: PolicyWrapper, spaces: MDPSpace, *, algorithm: str = GENRL_ALGORITHM
) -> PolicyGraph:
    """The traceable graph of a latent policy acting in the environment of ``spaces``.

    Args:
        policy_wrapper: The latent policy with its decoder and ``latent_scale``.
        spaces: The environment's MDP space (``actions`` the decoder's environment actions).
        algorithm: The name recorded in the export's metadata.

    Returns:
        A CPU, eval-mode snapshot whose inputs are the observation keys and ``epsilon`` of shape
        ``(latent_dim,)``, and whose output is ``actions``.

    Raises:
        ExportError: If an observation key is named ``epsilon``.
    """
    keys = tuple(spaces.state.keys())
    if EPSILON_INPUT in keys:
        raise ExportError(
            f"an observation key is named '{EPSILON_INPUT}', which exports reserve for the "
            "noise input; rename the observation key"
        )
    return policy_graph(
        LatentPolicyActing(policy_wrapper, keys), algorithm=algorithm, spaces=spaces,
        extra_inputs={EPSILON_INPUT: (policy_wrapper.latent_dim,)},
        output_names=(ACTIONS_OUTPUT,),
    )  # fmt: skip


__all__ = ["GENRL_ALGORITHM", "LatentPolicyActing", "latent_policy_graph"]
