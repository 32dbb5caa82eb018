"""The CPU dispatch one level below this machine's best: the settings of the test suite's second pass.

torch, oneDNN, OpenCV, numpy and glibc's libm each pick their kernels by the instruction sets the CPU has, and
kernels of different vector widths (or with and without FMA) round floats differently. A test that pins a kernel's
output bit for bit, or compares two code paths that happen to round alike on one instruction set, then passes on the
developer's machine and fails on a user's. ``make test`` therefore runs the tests that compare such outputs once more
with every library capped one level below what this CPU runs by default: AVX-512 -> AVX2, AVX2 -> nothing beyond
SSE4.1 (torch's "default" kernels, no FMA). On a CPU without AVX2 there is no level below to try.

    python -m tests.cpu_dispatch    # prints them, e.g. ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 ...

Not capped: the NAC layer's own C kernel (nac_native), whose instruction-set clones are picked by the loader; its
tests run each of its levels (tests/policies/test_topk.py, the ``scan_level`` fixture).
"""
from __future__ import annotations

import os

SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OPENCV_CPU_DISABLE", "NPY_DISABLE_CPU_FEATURES",
            "GLIBC_TUNABLES")
# numpy's dispatch targets (numpy >= 2.4 groups them as X86_V3 / X86_V4, older versions name each extension)
NUMPY_AVX512 = ("X86_V4", "AVX512F", "AVX512CD", "AVX512_KNL", "AVX512_KNM", "AVX512_SKX", "AVX512_CLX",
                "AVX512_CNL", "AVX512_ICL", "AVX512_SPR")
NUMPY_AVX2 = ("X86_V3", "AVX", "F16C", "FMA3", "AVX2") + NUMPY_AVX512
# OpenCV's names and cv::CPU_* ids: AVX512F alone turns off every AVX-512 dispatch (each one requires it)
OPENCV_AVX512 = {"AVX512F": 13}
OPENCV_AVX2 = {"AVX": 10, "FP16": 9, "AVX2": 11, "FMA3": 12, **OPENCV_AVX512}


def best() -> str:
    """torch's kernel level on this CPU with nothing capped: "AVX512", "AVX2", "DEFAULT", ..."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def one_level_below(capability: str) -> dict[str, str]:
    """The environment that caps every library one level below ``capability`` (``best()``); {} when none is."""
    if capability.startswith("AVX512"):
        aten, onednn, numpy_off, opencv_off, glibc_off = "avx2", "AVX2", NUMPY_AVX512, OPENCV_AVX512, "-AVX512F"
    elif capability == "AVX2":
        aten, onednn, numpy_off, opencv_off, glibc_off = "default", "SSE41", NUMPY_AVX2, OPENCV_AVX2, "-AVX2,-FMA"
    else:
        return {}
    import cv2

    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    dispatched = set(umath.__cpu_dispatch__) & {k for k, on in umath.__cpu_features__.items() if on}
    env = {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn,
           # only what this CPU has and the library knows: anything else is an error (numpy) or a warning (OpenCV)
           "NPY_DISABLE_CPU_FEATURES": ",".join(n for n in numpy_off if n in dispatched),
           "OPENCV_CPU_DISABLE": ",".join(n for n, i in opencv_off.items() if cv2.checkHardwareSupport(i)),
           "GLIBC_TUNABLES": f"glibc.cpu.hwcaps={glibc_off}"}  # libm's FMA / AVX2 / AVX-512 variants
    return {k: v for k, v in env.items() if v}


if __name__ == "__main__":
    for name in SETTINGS:  # what this CPU does with nothing capped, whatever the caller's environment says
        os.environ.pop(name, None)
    print(" ".join(f"{k}={v}" for k, v in one_level_below(best()).items()))
