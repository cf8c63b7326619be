"""``emote train`` as one torchrun rank that also dumps what it trained, for
``test_train_ddp.py``: rank 1 writes nothing of its own, so the test needs this to see it.

Usage: ``torchrun ... ddp_rank_dump.py OUT_DIR train RECIPE ...``. Runs the real command (the
``emote`` app, in this process) with the arguments after ``OUT_DIR``, keeping the training run
that ``build_training`` assembled, then saves its networks' weights, its losses' optimiser states
and its replay table's sampling generators to ``OUT_DIR/rank<RANK>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

import emote_core.assembly.training as training
from emote_cli.app import main
from emote_core.callbacks.loss import LossCallback
from emote_core.utils.random_state import capture

built: list[Any] = []
_build = training.build_training


def _keeping(*args: Any, **kwargs: Any) -> Any:
    setup = _build(*args, **kwargs)
    built.append(setup)
    return setup


def _dump(out: Path) -> None:
    setup = built[0]
    networks: dict[str, Any] = {}
    for name, value in vars(setup.networks).items():
        if isinstance(value, torch.nn.Module):
            networks[name] = value.state_dict()
        elif isinstance(value, torch.Tensor):
            networks[name] = value.detach().clone()
        elif isinstance(value, dict):
            networks.update({f"{name}.{k}": v.state_dict() for k, v in value.items()})
    losses = [c for c in setup.trainer.callbacks if isinstance(c, LossCallback)]
    torch.save(
        {
            "networks": networks,
            "optimizers": {loss.name: loss.optimizer.state_dict() for loss in losses},
            "table_random_state": capture(setup.table.random_generators()),
            "bp_step": setup.trainer.state["bp_step"],
        },
        out / f"rank{os.environ['RANK']}.pt",
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    training.build_training = _keeping
    sys.argv = ["emote", *sys.argv[2:]]
    try:
        main()
    except SystemExit as exit_:
        if built and not exit_.code:
            _dump(out)
        raise
    if built:
        _dump(out)
