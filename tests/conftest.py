"""Shared test setup: headless pygame, small thread counts so the 2-core CI machine stays responsive."""
import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import pytest  # noqa: E402
import torch  # noqa: E402

# under pytest-xdist (make test: one worker per core) each worker keeps to one thread, so workers do not fight
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

# The files that take longest (a third of the suite), in the order they are handed to the workers (make test runs
# --dist loadfile --no-loadscope-reorder): the longest first, so that no worker starts one as the other runs dry.
SLOWEST_FILES = ("agent/test_workers.py", "agent/evaluation/test_evaluate.py", "agent/training/test_distributed.py",
                 "agent/training/test_experiment.py", "test_replay_pipeline.py", "agent/data/test_collection.py",
                 "test_udacity_pipeline.py")


def pytest_collection_modifyitems(config, items):
    tests = config.rootpath / "tests"

    def rank(item) -> int:
        path = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return SLOWEST_FILES.index(path) if path in SLOWEST_FILES else len(SLOWEST_FILES)

    items.sort(key=rank)  # stable: within a file, and among the rest, the collected order


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same RNG state, so a failure reproduces."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def udacity_drive(tmp_path_factory):
    """The udacity expert's drive of ``DRIVE_STEPS`` steps on one track without noise, as collect.py records it: the
    recording the replay (envs/replay), its benchmarks and the replay's whole pipeline are tested on (made once)."""
    import collect
    from tests.helpers import DRIVE_STEPS

    out = tmp_path_factory.mktemp("replay") / "drive"
    assert collect.main(["--env", "udacity", "--episodes", "1", "--max-steps", str(DRIVE_STEPS), "--noise", "0",
                         "--seed", "3000001", "--workers", "1", "--out", str(out), "--no-progress"]) == 0
    return out
