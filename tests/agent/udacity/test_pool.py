"""The pool of public recordings: the manifest's rules, the import into one training set, and its weighting."""
import json

import numpy as np
import pytest

from agent.udacity import pool
from driving_data.dataset import open_datasets
from tests.driving_data.test_udacity_import import _sim_recording

HEADER = ",".join(pool.COLUMNS)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _manifest(path, rows):
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def _row(name, track="lake", steering="keyboard", role="pool", licence="MIT", commit=COMMIT, rows=6, csv_rows=""):
    return f"{name},someone/{name}-repo,{commit},data,{track},{steering},{rows},{csv_rows},{licence},{role},"


def test_the_shipped_manifest_reads_and_names_both_roles():
    entries = pool.read_manifest()
    assert {e.role for e in entries} == {"pool", "held-out"}
    assert len({e.name for e in entries}) == len(entries)


@pytest.mark.parametrize("row, said", [
    (_row("a", track="moon"), "unknown track 'moon'"),
    (_row("a", steering="wheel"), "unknown steering 'wheel'"),
    (_row("a", role="test"), "unknown role 'test'"),
    (_row("a", commit="abc"), "commit 'abc' is not 40 hexadecimal digits"),
    (_row("A b"), "name 'A b' is not"),
    (_row("a", licence=""), "licence is empty"),
    (_row("a", csv_rows="4-2"), "csv_rows '4-2' is not START-STOP"),
    (_row("a", csv_rows="0-5"), "csv_rows 0-5 is 5 rows, but rows says 6"),
])
def test_a_bad_manifest_line_is_one_error_naming_the_line(tmp_path, row, said):
    path = _manifest(tmp_path / "m.csv", [_row("ok"), row])
    with pytest.raises(ValueError, match=f"m.csv:3: {said}"):
        pool.read_manifest(path)


def test_import_pool_joins_the_recordings_found_and_names_the_missing(tmp_path, capsys):
    manifest = _manifest(tmp_path / "m.csv", [_row("a"), _row("b", track="jungle", steering="mouse", rows=3),
                                              _row("gone"), _row("h", role="held-out")])
    _sim_recording(tmp_path / "rec" / "a")
    _sim_recording(tmp_path / "rec" / "b", offsets_s=(0, 0.1, 0.2))
    _sim_recording(tmp_path / "rec" / "h")
    assert pool.main(["import", "--root", str(tmp_path / "rec"), "--out", str(tmp_path / "pool"),
                      "--manifest", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 pool recordings are not under" in out and "gone" in out
    assert "2 recordings, 9 frames (jungle 3, lake 6; keyboard 6, mouse 3)" in out
    card = json.loads((tmp_path / "pool" / "pool.json").read_text())
    assert [m["name"] for m in card["recordings"]] == ["a", "b"] and card["weight"] == "sqrt"
    assert open_datasets(str(tmp_path / "pool")).num_steps == 9, "the pool folder opens as its recordings"
    assert not (tmp_path / "pool" / "h").exists(), "held-out recordings stay out of the pool"


def test_pool_mistakes_are_one_line(tmp_path, capsys):
    manifest = _manifest(tmp_path / "m.csv", [_row("a")])
    args = ["import", "--root", str(tmp_path / "rec"), "--out", str(tmp_path / "pool"), "--manifest", str(manifest)]
    assert pool.main(args) == 2
    assert "none of the 1 pool recordings" in capsys.readouterr().err
    (tmp_path / "rec" / "a").mkdir(parents=True)
    assert pool.main(args) == 2
    assert "has no driving_log.csv" in capsys.readouterr().err
    _sim_recording(tmp_path / "rec2" / "a")
    for f in (tmp_path / "rec2" / "a" / "IMG").iterdir():
        f.unlink()
    assert pool.main([*args[:2], str(tmp_path / "rec2"), *args[3:]]) == 2
    assert "has no images in IMG/" in capsys.readouterr().err
    assert pool.main(["sources", "--manifest", str(tmp_path / "nope.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sources_prints_a_clone_at_the_commit_for_each(capsys):
    assert pool.main(["sources", "--role", "held-out"]) == 0
    out = capsys.readouterr().out
    held = [e for e in pool.read_manifest() if e.role == "held-out"]
    assert out.count("git clone") == len(held) and all(f"checkout -q {e.commit}" in out for e in held)


def test_two_sessions_of_one_repository_at_two_commits_get_a_checkout_each(tmp_path):
    """One clone checked out at both commits would leave both links on the later session's files."""
    first, second = "a" * 40, "b" * 40
    manifest = _manifest(tmp_path / "m.csv", [_row("x", commit=first).replace("someone/x-repo", "someone/r"),
                                              _row("y", commit=second).replace("someone/y-repo", "someone/r")])
    x, y = (e.clone_commands(tmp_path / "rec") for e in pool.read_manifest(manifest))
    clone_x, clone_y = (cmd.split("git -C ")[1].split()[0] for cmd in (x, y))
    assert clone_x != clone_y and f"checkout -q {first}" in x and f"checkout -q {second}" in y
    assert x.endswith(f"{clone_x}/data {tmp_path / 'rec' / 'x'}")
    assert y.endswith(f"{clone_y}/data {tmp_path / 'rec' / 'y'}")


def test_a_pool_trains_with_its_recordings_weighted_by_the_square_root(tmp_path):
    from agent.training.config import TrainArgs, resolve
    from agent.training.experiment import run

    manifest = _manifest(tmp_path / "m.csv", [_row("a", rows=16), _row("b", rows=4)])
    _sim_recording(tmp_path / "rec" / "a", offsets_s=tuple(0.1 * k for k in range(16)))
    _sim_recording(tmp_path / "rec" / "b", offsets_s=tuple(0.1 * k for k in range(4)))
    pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool", say=lambda m: None)
    run(resolve(TrainArgs(data=str(tmp_path / "pool"), out=str(tmp_path / "run"), epochs=1, batch_size=8, segment=4,
                          window=2,
                  frame_stride=1, feature_dim=8, d_model=16, heads=4, threads=1, progress=False, split="episodes")))
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert args["dataset_weight"] == "sqrt" and len(args["data"]) == 2


def test_episode_shares_keep_the_epoch_and_split_it_by_the_rule():
    from agent.training.windows import episode_shares, make_segments

    lengths, sources = {0: 900, 1: 100, 2: 100}, [0, 1, 1]  # folder 0: 900 steps; folder 1: 200
    assert episode_shares(lengths, sources, "frames") is None
    for weight, want in (("sqrt", 30 / (30 + 200 ** 0.5)), ("equal", 0.5)):
        shares = episode_shares(lengths, sources, weight)
        seen = {e: shares[e] * n for e, n in lengths.items()}
        assert sum(seen.values()) == pytest.approx(1100), "an epoch keeps its length"
        assert seen[0] / 1100 == pytest.approx(want)
        segs = make_segments(lengths, 10, np.random.default_rng(0), shares=shares)
        steps0 = sum(b - a for e, a, b in segs if e == 0)
        assert steps0 / sum(b - a for _, a, b in segs) == pytest.approx(want, abs=0.02)


def test_dagger_on_a_pool_drives_the_replay_of_each_recording(tmp_path):
    from agent.training.dagger import RECIPES, Lineage, plan_rounds

    manifest = _manifest(tmp_path / "m.csv", [_row("a", rows=12), _row("b", rows=12)])
    for name in ("a", "b"):
        _sim_recording(tmp_path / "rec" / name, offsets_s=tuple(0.1 * k for k in range(12)))
    pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool", say=lambda m: None)
    lin = Lineage(recording=str(tmp_path / "pool"), rounds=1, round_epochs=2, data=str(tmp_path / "dagger"),
                  out=str(tmp_path / "runs"))
    plans = plan_rounds(lin, RECIPES["replay"], log=lambda m: None)
    assert plans[0].collects == [] and plans[0].train.data == str((tmp_path / "pool").resolve())
    envs = [c.env for c, _ in plans[1].collects]
    assert envs == [f"replay:{(tmp_path / 'pool' / n).resolve()}" for n in ("a", "b")]
    assert [str(c.out) for c, _ in plans[1].collects] == [str(tmp_path / "dagger" / "r1" / n) for n in ("a", "b")]
    assert plans[1].train.data[1:] == [str(tmp_path / "dagger" / "r1" / n) for n in ("a", "b")]
    assert plans[1].train.init == str(tmp_path / "runs" / "r0" / "best.pt") and plans[1].train.epochs == 2


@pytest.mark.parametrize("flag, value", [("--round-epochs", "0"), ("--dataset-weight", "most")])
def test_bad_pool_training_values_are_one_line(tmp_path, capsys, flag, value):
    import train
    from agent.training import dagger

    main = dagger.main if flag == "--round-epochs" else train.main
    argv = ["--recording", str(tmp_path)] if flag == "--round-epochs" else ["--data", str(tmp_path)]
    try:
        code = main([*argv, flag, value])
    except SystemExit as e:  # argparse's own refusal of a choice
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


def test_a_recording_the_import_refuses_is_left_out_with_one_line(tmp_path):
    manifest = _manifest(tmp_path / "m.csv", [_row("a"), _row("bad")])
    _sim_recording(tmp_path / "rec" / "a")
    _sim_recording(tmp_path / "rec" / "bad", rows=lambda lines: [ln.rsplit(",", 1)[0] + ", 500.5" for ln in lines])
    said = []
    card = pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool", say=said.append)
    assert [m["name"] for m in card["recordings"]] == ["a"] and list(card["refused"]) == ["bad"]
    assert any(line.startswith("bad: left out of the pool:") for line in said)


@pytest.mark.parametrize("header", [False, True])
def test_two_recordings_in_one_log_are_each_imported_as_their_rows(tmp_path, header):
    """One published log can hold a lake session and a jungle one: each manifest entry takes its own rows."""
    manifest = _manifest(tmp_path / "m.csv", [_row("lake", rows=4, csv_rows="0-4"),
                                              _row("jungle", track="jungle", rows=2, csv_rows="4-6")])
    _sim_recording(tmp_path / "both", header=header)
    for name in ("lake", "jungle"):
        (tmp_path / "rec" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "rec" / name).symlink_to(tmp_path / "both")
    card = pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool",
                            say=lambda m: None)
    assert {m["name"]: m["steps"] for m in card["recordings"]} == {"lake": 4, "jungle": 2}
    jungle = open_datasets(str(tmp_path / "pool" / "jungle"))
    assert jungle.num_steps == 2 and np.allclose(jungle.load(0, "action")["action"][:, 0], [-0.2, -0.25]), \
        "the jungle entry is the log's last two rows"
    again = pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool",
                             say=(said := []).append)
    assert again == card and not any("importing" in line for line in said), "an unchanged part is reused"


def test_rows_beyond_the_log_leave_the_recording_out_with_one_line(tmp_path):
    manifest = _manifest(tmp_path / "m.csv", [_row("a"), _row("b", rows=4, csv_rows="4-8")])
    _sim_recording(tmp_path / "rec" / "a")
    _sim_recording(tmp_path / "rec" / "b")
    card = pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool",
                            say=lambda m: None)
    assert [m["name"] for m in card["recordings"]] == ["a"]
    assert "has 6 rows; the manifest takes rows 4-8 (another commit" in card["refused"]["b"]


@pytest.mark.parametrize("header", [False, True])
def test_a_whole_log_of_other_rows_than_the_manifest_says_is_left_out_naming_the_entry(tmp_path, header):
    """An entry without csv_rows is checked too: 9,999 rows in the manifest against a 6-row log is another commit or
    another recording, not the one the manifest names."""
    manifest = _manifest(tmp_path / "m.csv", [_row("a"), _row("b", rows=9999)])
    _sim_recording(tmp_path / "rec" / "a", header=header)
    _sim_recording(tmp_path / "rec" / "b", header=header)
    said = []
    card = pool.import_pool(pool.read_manifest(manifest), tmp_path / "rec", tmp_path / "pool", "pool", say=said.append)
    assert [m["name"] for m in card["recordings"]] == ["a"] and list(card["refused"]) == ["b"]
    (line,) = [s for s in said if s.startswith("b: left out of the pool:")]
    assert "has 6 rows, but the manifest's entry b says 9999" in line and "\n" not in line
