"""A run's --out folder (its lock, the claim before any work) and a file's SHA-256."""

import hashlib

import pytest

from common.files import file_sha256, folder_lock, run_folder


def test_file_sha256_is_the_hash_of_the_bytes(tmp_path):
    data = bytes(range(256)) * 5000  # more than one read of 1 MiB
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_a_second_holder_of_a_folder_is_refused_in_one_line_naming_the_first(tmp_path):
    with folder_lock(tmp_path / "out", "train.py"):
        with pytest.raises(ValueError, match=r"another train.py is writing into .* \(pid \d+\)"):
            with folder_lock(tmp_path / "out", "evaluate.py"):
                pass
    with folder_lock(tmp_path / "out", "evaluate.py"):  # released with its holder
        pass


def test_a_run_folder_removes_stale_temp_files_and_an_empty_folder_it_made(tmp_path):
    out = tmp_path / "a" / "b"
    with run_folder(out, "train.py"):
        assert (out / ".lock").is_file()
    assert not (tmp_path / "a").exists(), "made here and left empty: removed"
    out.mkdir(parents=True)
    (out / ".metrics.json.abc123.tmp").write_text("{")
    with run_folder(out, "train.py"):
        (out / "metrics.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "metrics.json"]
    with run_folder(tmp_path / "rank1", "train.py", lock=False):
        pass
    assert not (tmp_path / "rank1").exists()
