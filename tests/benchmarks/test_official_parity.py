"""The parity benchmark against the authors' TensorFlow layer: one-line mistakes everywhere; the comparison itself
where TensorFlow is installed and NAC_OFFICIAL_REFERENCE names a checkout of their repository."""
import json
import os
from importlib.util import find_spec
from pathlib import Path

import pytest

from benchmarks import official_parity

REFERENCE = os.environ.get("NAC_OFFICIAL_REFERENCE")


def one_line_error(capsys, argv: list[str]) -> str:
    assert official_parity.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


def test_a_missing_folder_or_one_without_their_layer_is_one_line(tmp_path, capsys):
    assert "no such folder" in one_line_error(capsys, ["--reference", str(tmp_path / "nowhere")])
    (tmp_path / "neuronal_attention_circuit.py").write_text("print('something else')\n")
    assert "checkout of the authors' repository" in one_line_error(capsys, ["--reference", str(tmp_path)])


def test_without_tensorflow_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    (tmp_path / "CarRacing_exp").mkdir()  # a layer file found in an experiment folder; never imported here
    (tmp_path / "CarRacing_exp" / "neuronal_attention_circuit.py").write_text("class NAC(\nclass NCPCell(\n")
    monkeypatch.setattr(official_parity, "find_spec", lambda name: None)
    err = one_line_error(capsys, ["--reference", str(tmp_path)])
    assert "TensorFlow is not installed" in err and ".[official]" in err


@pytest.mark.skipif(find_spec("tensorflow") is None or not REFERENCE,
                    reason="needs TensorFlow (pip install -e '.[official]') and "
                           "NAC_OFFICIAL_REFERENCE=<their checkout>")
def test_nac_official_computes_their_layer_in_every_mode(tmp_path, capsys):
    out = tmp_path / "parity.json"
    assert official_parity.main(["--reference", REFERENCE, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["agree"] and result["worst"] <= 1e-5
    for mode in ("exact", "steady", "euler"):
        for case in ("x", "x, t [B]", "x, elu"):
            assert result["max_abs_diff"][mode][case] <= 1e-5, (mode, case)
    checks = result["their_layer"]  # what the mapping relies on, measured on their layer
    assert checks["qkv_read_every_input"] and checks["qkv_state_carried"] == 0
    assert not checks["backbone_reads_the_pair"] and checks["backbone_kernel_grad_max"] == 0
    assert "| exact |" in capsys.readouterr().out
    assert Path(result["reference"]).name == "neuronal_attention_circuit.py"
