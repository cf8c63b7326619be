"""CURL as the ``curl`` add-on: a contrastive loss that trains the image encoder of an algorithm's
networks beside its RL losses (the loss itself is :class:`emote_core.nn.curl.CurlLoss`)."""

from __future__ import annotations

from emote_core.algorithms.curl.addon import CurlAddOn, CurlConfig

__all__ = ["CurlAddOn", "CurlConfig"]
