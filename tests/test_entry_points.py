"""Every ``python -m`` tool built on common.cli, as a user starts it: --help shows grouped sections, and an unknown
flag is one line on stderr and exit status 2 (no usage dump, no traceback)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.cli import GROUP_ORDER

REPO = Path(__file__).resolve().parents[1]
MODULES = [
    "agent.data.merge", "agent.data.minari_export", "agent.evaluation.table", "agent.experts.ppo",
    "agent.training.dagger", "agent.udacity.bridge", "agent.udacity.recordings", "envs.replay.calibrate",
    "benchmarks.carracing_render", "benchmarks.cuda_cores", "benchmarks.data_loading", "benchmarks.feedback_gains",
    "benchmarks.nac_runtime", "benchmarks.replay_agreement", "benchmarks.replay_speed", "benchmarks.replay_views",
    "benchmarks.throughput", "benchmarks.udacity_sim",
]


def _run(module: str, flag: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, flag], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("module", MODULES)
def test_help_is_grouped_and_a_wrong_flag_is_one_line(module):
    shown = _run(module, "--help")
    assert shown.returncode == 0, shown.stderr
    assert any(f"\n{group}:\n" in shown.stdout for group in GROUP_ORDER), shown.stdout
    wrong = _run(module, "--definitely-not-a-flag")
    lines = wrong.stderr.splitlines()
    assert wrong.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), wrong.stderr
