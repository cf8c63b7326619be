"""MultiKeyAgentProxy: a policy reading several observation entries as one flat vector."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from emote_core.nn.inputs import flatten_observation
from emote_core.proxies.generic import ACTIONS_KEY, GenericAgentProxy
from emote_core.spaces import MDPSpace


class MultiKeyAgentProxy(GenericAgentProxy):
    """Flattens and concatenates several observation entries, in key order, for one policy input.

    The concatenation is :func:`emote_core.nn.inputs.flatten_observation`, the one the losses use
    on training batches, so acting and training see the same vector for the same keys.

    Args:
        policy: The network, ``policy(features)`` or ``policy(features, epsilon)``.
        device: Where the policy runs.
        input_keys: The observation keys, in concatenation order.
        deterministic: Act with zero noise.
        spaces: The MDP space to validate observations and cast actions with.
        seed: Seeds the noise generator.
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        device: torch.device | str,
        input_keys: Sequence[str],
        deterministic: bool = False,
        spaces: MDPSpace | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            policy=policy,
            device=device,
            input_keys=input_keys,
            output_keys=[ACTIONS_KEY],
            spaces=spaces,
            deterministic=deterministic,
            seed=seed,
        )

    def _inputs(self, batches: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [flatten_observation(batches, list(self.input_names))]


__all__ = ["MultiKeyAgentProxy"]
