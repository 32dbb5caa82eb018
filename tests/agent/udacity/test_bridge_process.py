"""The bridge as a process: one torch thread unless asked, and SIGTERM stops it with the summary as Ctrl-C does."""
import signal
import subprocess
import sys
import time

import pytest
import torch

from agent.udacity import bridge as ub
from policies.policy import save_checkpoint
from tests.agent.udacity.test_bridge import HAVE_SOCKETIO, _udacity_policy

pytestmark = pytest.mark.skipif(not HAVE_SOCKETIO, reason="python-socketio/eventlet not installed")


def _serve(argv, stop):
    proc = subprocess.Popen([sys.executable, "-m", "agent.udacity.bridge", *argv, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving"), proc.communicate(timeout=30)
        time.sleep(0.3)
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, first + out, err


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_bridge_prints_its_summary(stop, tmp_path):
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "steer.pt", _udacity_policy())
    rc, out, err = _serve([str(ckpt)], stop)
    assert rc == 0 and "served 0 frames" in out and "Traceback" not in err, (out, err)
    assert "with 1 torch thread(s)" in out


def test_threads_flag(tmp_path, capsys):
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "steer.pt", _udacity_policy())
    rc, out, _ = _serve([str(ckpt), "--threads", "2"], signal.SIGTERM)
    assert rc == 0 and "with 2 torch thread(s)" in out
    with pytest.raises(SystemExit) as e:
        ub.main([str(ckpt), "--threads", "0"])
    assert e.value.code == 2 and "threads must be an integer >= 1, got 0" in capsys.readouterr().err
