"""agent/runtime.py: the allocator setting every training run makes (keep_freed_memory)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# a training step's batch-sized block (20 MiB): where glibc takes it from, and whether the heap keeps it once freed
BLOCK = r"""
import ctypes, sys, torch
from agent.runtime import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory()
heap = libc.mallinfo2().arena
x = torch.ones(5 << 20)
mapped = libc.mallinfo2().hblkhd >= 20 << 20
del x
print(int(mapped), (libc.mallinfo2().arena - heap) >> 20)
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(None)
        return hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc's allocator (2.33 or later) is what is set")
def test_a_step_sized_block_comes_from_the_heap_and_stays_there_once_freed():
    """By default glibc maps a 20 MiB block afresh and unmaps it when freed (the next step faults its pages in
    again); after keep_freed_memory the heap serves it and keeps it for the next step."""

    def block(mode: str) -> list[int]:
        r = subprocess.run([sys.executable, "-c", BLOCK, mode], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return [int(v) for v in r.stdout.split()]

    assert block("default") == [1, 0]  # mapped, and the heap did not grow
    mapped, kept_mib = block("keep")
    assert mapped == 0 and kept_mib >= 20
