"""The layer without its native kernels (NAC_NATIVE=0, as on a machine without a compiler): the same outputs from
torch's selection, and exact selection on torch's path in bounded memory at long sequences."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from policies.nac import NAC


def test_layer_without_the_native_kernel_gives_the_same_outputs(tmp_path):
    """NAC_NATIVE=0 (as on a machine without a compiler): torch.topk selects and the outputs are the same."""
    script = ("import sys, torch; from policies import nac_native; from policies.nac import NAC\n"
              "torch.manual_seed(0); x = torch.randn(2, 300, 6)\n"
              "torch.save((nac_native.available(), NAC(6, 16, 2, topk=5, causal=True)(x)), sys.argv[1])\n")
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "NAC_NATIVE": "0", "PYTHONPATH": path}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.pt")], check=True, cwd=root, env=env,
                   timeout=120)
    available, y = torch.load(tmp_path / "out.pt")
    assert available is False
    torch.manual_seed(0)
    x = torch.randn(2, 300, 6)
    torch.testing.assert_close(y, NAC(6, 16, 2, topk=5, causal=True)(x), atol=1e-6, rtol=1e-6)


MEMORY_SCRIPT = """\
import sys, torch
from policies.nac import NAC

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

torch.set_num_threads(2)
torch.manual_seed(0)
layer, x = NAC(64, 64, 4, topk=8, seed=0, selection="exact"), torch.randn(1, 16384, 64)
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak-RSS mark (VmHWM) starts again from here
except OSError:
    sys.exit(3)
before = status("VmRSS")
with torch.no_grad():
    layer(x)
print((status("VmHWM") - before) / 2**20)
"""


def test_exact_selection_on_torch_keeps_its_memory_at_t_16384():
    """T = 16384, exact selection on torch's path (NAC_NATIVE=0, as where no compiler builds the kernel), one
    forward in a fresh process: the peak RSS grows by about 210 MB here (scores in chunks of 64 queries, one buffer
    reused). A fresh 16 MB score tensor per chunk, freed while the chunk's small results stayed, ratcheted glibc's
    heap up to 0.8-1.7 GB, by its arenas and the thread count (about 10 s)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux /proc for the RSS")
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "NAC_NATIVE": "0", "PYTHONPATH": path}, timeout=300)
    if out.returncode == 3:
        pytest.skip("/proc/self/clear_refs is not writable here: no peak RSS of the pass alone")
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) < 600, f"one forward grew the RSS by {float(out.stdout):.0f} MB"
