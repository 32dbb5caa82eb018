"""The fine-tune benchmark's pieces: a recording's first frames as a recording, and the paired table."""

import pytest

from driving_data.udacity_import import import_udacity
from benchmarks import pool_fine_tune
from driving_data.dataset import open_dataset
from tests.driving_data.test_udacity_import import _sim_recording


def test_the_first_frames_of_a_recording_are_a_recording_of_their_own(tmp_path):
    _sim_recording(tmp_path / "rec", offsets_s=tuple(round(0.1 * k, 1) for k in range(12)), header=True)
    import_udacity(tmp_path / "rec", tmp_path / "data")
    short = pool_fine_tune.first_frames(tmp_path / "data", 5, tmp_path / "short")
    assert open_dataset(import_udacity(short, tmp_path / "short_data")).num_steps == 5


def test_a_dataset_that_is_no_import_is_one_error(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset.json").write_text("{}")
    with pytest.raises(ValueError, match="not the import of a recording"):
        pool_fine_tune.first_frames(tmp_path / "data", 5, tmp_path / "short")


def _rows(per_100s: dict[str, list[float]]) -> dict[str, list[dict]]:
    return {v: [{"per_100s": x, "offline_vs_straight": 0.5} for x in xs] for v, xs in per_100s.items()}


def test_the_table_pairs_fine_tuned_with_scratch_by_seed():
    rows = _rows({"scratch": [10, 20], "fine-tuned": [4, 6], "scratch-1000": [30, 30], "fine-tuned-1000": [5, 15]})
    text = pool_fine_tune.summary({"rec": rows})
    assert "| rec | 2 | 15.0 ± 5.0 | 5.0 ± 1.0 | 30.0 ± 0.0 | 10.0 ± 5.0 | -10.0 ± 4.0 | -20.0 ± 5.0 |" in text


def test_fine_tunes_alone_make_a_table_without_the_paired_column():
    text = pool_fine_tune.summary({"rec": _rows({"fine-tuned": [4, 6], "fine-tuned-1000": [5, 15]})})
    assert text.splitlines()[0].startswith("| recording | seeds | fine-tuned | fine-tuned-1000 | offline")
    assert "| rec | 2 | 5.0 ± 1.0 | 10.0 ± 5.0 | 0.50 / 0.50 |" in text


def test_every_variant_is_paired_with_the_unchanged_student_judged_once():
    rows = _rows({"unchanged": [3], "fine-tuned": [4, 6], "fine-tuned@0.5": [2, 3]})
    text = pool_fine_tune.summary({"rec": rows})
    assert "fine-tuned - unchanged | fine-tuned@0.5 - unchanged" in text.splitlines()[0]
    assert "| rec | 2 | 3.0 ± 0.0 | 5.0 ± 1.0 | 2.5 ± 0.5 | 2.0 ± 1.0 | -0.5 ± 0.5 |" in text


def test_variant_names_say_what_is_trained_and_mixed():
    assert pool_fine_tune.parse_variant("fine-tuned@0.5-1000") == pool_fine_tune.Variant("fine-tuned", 0.5, True)
    assert pool_fine_tune.parse_variant("recovery") == pool_fine_tune.Variant("recovery", None, False)
    near = pool_fine_tune.parse_variant("near-init=0.1@0.5")
    assert near == pool_fine_tune.Variant("near-init", 0.5, False, 0.1) and near.trained == "near-init=0.1"
    assert pool_fine_tune.parse_variant("near-init=0.01-1000").trained == "near-init=0.01-1000"
    flags = pool_fine_tune.train_flags(pool_fine_tune.PoolFineTuneArgs(recordings=["r"]), near)
    assert flags[-2:] == ["--stay-near-init", "0.1"] and "--init" in flags
    frozen = pool_fine_tune.train_flags(
        pool_fine_tune.PoolFineTuneArgs(recordings=["r"]), pool_fine_tune.parse_variant("frozen")
    )
    assert frozen[-1] == "--freeze-encoder" and "--init" in frozen
    assert pool_fine_tune.parse_variant("dagger=0.5") == pool_fine_tune.Variant("dagger", None, False, 0.5)
    assert pool_fine_tune.parse_variant("dagger-1000").trained == "dagger-1000"
    for wrong, says in [
        ("dagger=1.5", "--round-blend W in"),
        ("tuned", "unknown variant"),
        ("unchanged@0.5", "neither mixed"),
        ("fine-tuned@1.5", "(0, 1)"),
        ("near-init", "near-init=L"),
        ("near-init=0", "L > 0"),
        ("fine-tuned=0.1", "no other"),
    ]:
        with pytest.raises(ValueError, match=says):
            pool_fine_tune.parse_variant(wrong)


def test_an_unknown_variant_is_one_line(tmp_path, capsys):
    assert pool_fine_tune.main(["--recordings", "x", "--variants", "tuned", "--out", str(tmp_path)]) == 2
    assert "unknown variant 'tuned'" in capsys.readouterr().err


def test_the_dagger_variant_starts_from_the_fine_tuned_run_blended_with_the_start(tmp_path, monkeypatch):
    """Its round 0 is the fine-tuned variant's finished run (the same training), best.pt the half-and-half blend
    with the pooled student; the lineage then runs as the one command would."""
    import torch

    from agent.training import dagger, experiment
    from policies.checkpoint import load_checkpoint
    from tests.helpers import steering_checkpoint

    start, tuned = steering_checkpoint(tmp_path / "start.pt", 0.1), tmp_path / "ft"
    tuned.mkdir()
    steering_checkpoint(tuned / "best.pt", 0.3)
    for name in ("args.json", "metrics.json", "last.pt"):
        (tuned / name).write_text("{}")
    monkeypatch.setattr(experiment, "finished", lambda run: (run / "metrics.json").is_file())
    seen = []
    monkeypatch.setattr(dagger, "run_lineage", lambda lin: seen.append(lin) or {"final": str(tmp_path / "r1.pt")})
    a = pool_fine_tune.PoolFineTuneArgs(recordings=["rec"], init=str(start), threads=1)
    best = pool_fine_tune._dagger(
        a, pool_fine_tune.parse_variant("dagger=0.5"), tmp_path / "rec", 3, tmp_path / "run", tuned, []
    )
    assert best == tmp_path / "r1.pt"
    lin = seen[0]
    assert (lin.recipe, lin.init, lin.seed, lin.round_blend, lin.out) == (
        "fine-tune",
        str(start),
        3,
        0.5,
        str(tmp_path / "run"),
    )
    r0 = tmp_path / "run" / "r0"
    bias = [load_checkpoint(p).head.bias for p in (start, tuned / "best.pt", r0 / "best.pt")]
    assert torch.allclose(bias[2], (bias[0] + bias[1]) / 2)
    assert (r0 / "best_tuned.pt").read_bytes() == (tuned / "best.pt").read_bytes()
    assert lin.rehearsal == []


def test_a_mix_of_the_dagger_variant_is_the_one_command_s_student_mixed_with_the_start(tmp_path, monkeypatch):
    """dagger@W judges (1 - W) x the pooled student + W x the one command's student, not the unmixed student."""
    import json
    from pathlib import Path

    import torch

    from benchmarks import heldout_drivers
    from policies.checkpoint import load_checkpoint
    from tests.helpers import steering_checkpoint

    start, final = steering_checkpoint(tmp_path / "start.pt", 0.1), steering_checkpoint(tmp_path / "r1.pt", 0.3)
    monkeypatch.setattr(pool_fine_tune, "_dagger", lambda a, v, rec, seed, run, tuned, rehearsal: final)
    judged = {}

    def judge(argv):
        names = argv[argv.index("--name") + 1 : argv.index("--span")]
        judged.update(zip(names, argv[argv.index("--checkpoint") + 1 : argv.index("--name")]))
        row = {"offline_vs_straight": 0.3, "frames": 10, "corr": 0.8, "per_100s": 1.0, "straight_per_100s": 40.0}
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "table.json").write_text(json.dumps({"rows": {"rec": {n: row for n in names}}}))

    monkeypatch.setattr(heldout_drivers, "main", judge)
    a = pool_fine_tune.PoolFineTuneArgs(
        recordings=[str(tmp_path / "rec")],
        init=str(start),
        threads=1,
        variants=["unchanged", "dagger", "dagger@0.5"],
        out=tmp_path / "out",
    )
    pool_fine_tune._benchmark(a)
    assert judged["dagger"] == str(final) and judged["dagger@0.5"] != str(final)
    bias = [load_checkpoint(p).head.bias for p in (start, final, judged["dagger@0.5"])]
    assert torch.allclose(bias[2], (bias[0] + bias[1]) / 2)


def test_the_rehearsal_variant_trains_the_other_recordings_beside_the_user_s(tmp_path, monkeypatch, capsys):
    """Its fine-tune's --data is the recording, then every --rehearsal folder; without them it is one line."""
    import json
    from pathlib import Path

    from benchmarks import heldout_drivers
    from tests.helpers import steering_checkpoint

    start = steering_checkpoint(tmp_path / "start.pt", 0.1)
    trained = []
    monkeypatch.setattr(pool_fine_tune, "_train", lambda argv, run: trained.append(argv) or start)

    def judge(argv):
        names = argv[argv.index("--name") + 1 : argv.index("--span")]
        row = {"offline_vs_straight": 0.3, "frames": 10, "corr": 0.8, "per_100s": 1.0, "straight_per_100s": 40.0}
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "table.json").write_text(json.dumps({"rows": {"rec": {n: row for n in names}}}))

    monkeypatch.setattr(heldout_drivers, "main", judge)
    rec, other = str(tmp_path / "rec"), [str(tmp_path / "pool_a"), str(tmp_path / "pool_b")]
    argv = ["--recordings", rec, "--init", str(start), "--variants", "fine-tuned", "rehearsal"]
    assert pool_fine_tune.main([*argv, "--rehearsal", *other, "--out", str(tmp_path / "out")]) == 0
    data = [a[a.index("--data") + 1 : a.index("--split")] for a in trained]
    assert data == [[rec], [rec, *other]]
    assert trained[1][trained[1].index("--init") + 1] == str(start)
    assert pool_fine_tune.main([*argv, "--out", str(tmp_path / "out2")]) == 2
    assert "the rehearsal variant trains on --rehearsal" in capsys.readouterr().err
    # the one command with --rehearsal: round 0 the rehearsal run of the seed, every round the same folders
    lineages = []
    monkeypatch.setattr(pool_fine_tune, "_dagger", lambda *args: lineages.append(args) or start)
    one = ["--recordings", rec, "--init", str(start), "--variants", "rehearsal-dagger", "--rehearsal", *other]
    assert pool_fine_tune.main([*one, "--out", str(tmp_path / "out3")]) == 0
    (_, variant, _, _, run, first, rehearsal) = lineages[0]
    assert (variant.base, first.name, rehearsal) == ("rehearsal-dagger", "rehearsal_s1", other)
    assert run.name == "rehearsal-dagger_s1"
