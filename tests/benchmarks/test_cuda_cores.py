"""Benchmark scripts' own behaviour (their figures live in docs/benchmarks.md, never in timed tests)."""

import pytest
import torch

from benchmarks import cuda_cores


def test_cuda_benchmark_without_a_gpu_is_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_cores.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no CUDA GPU") and err.count("\n") == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_benchmark_times_every_core(capsys):
    assert cuda_cores.main(["--seq-len", "64", "--batches", "1,2", "--repeats", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [r.split("|")[2].strip() for r in rows] == ["nac", "mha", "lstm"] * 2
    assert all(float(r.split("|")[3]) > 0 and float(r.split("|")[4]) > 0 for r in rows)
