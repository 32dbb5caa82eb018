"""Shared test setup: headless pygame, small thread counts so the 2-core CI machine stays responsive."""
import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import pytest  # noqa: E402
import torch  # noqa: E402

# under pytest-xdist (make test: one worker per core) each worker keeps to one thread, so workers do not fight
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same RNG state, so a failure reproduces."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
