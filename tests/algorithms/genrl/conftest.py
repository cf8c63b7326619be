"""GenRL's fixtures: a VAE trained once, by VAELoss, on demonstrations of a known distribution
(see ``demonstrations.py``)."""

from __future__ import annotations

import pytest

from tests.algorithms.genrl.demonstrations import TRAINING_STEPS, TrainedVae, train_vae


@pytest.fixture(scope="session")
def trained() -> TrainedVae:
    """The VAE of the known distribution, trained once for all of GenRL's tests."""
    return train_vae(beta=0.01, steps=TRAINING_STEPS)
