"""The DAgger lineage runner on tiny settings: real env, real collection, real training, resumed after a loss."""
import json

import pytest

from agent.training.dagger import Lineage, Recipe, Round, main, run_lineage
from driving_data.dataset import open_dataset
from policies.checkpoint import load_checkpoint

TINY_RECIPE = {"tiny": Recipe(expert_episodes=2, epochs=1, episodes=1, rounds=(Round(0.5, 1, 5e-4),),
                              driver_actions="sample")}
TINY_TRAIN = dict(window=3, frame_stride=2, batch_size=32, segment=8, feature_dim=16, hidden=16, log_every=2)


def _lineage(tmp_path, **kw) -> Lineage:
    base = dict(core="mlp", seed=3, recipe="tiny", data=str(tmp_path / "data"), out=str(tmp_path / "runs"),
                renderer="fast", workers=1, threads=1, max_steps=40, progress=False, train_options=TINY_TRAIN)
    return Lineage(**{**base, **kw})


def test_a_lineage_runs_its_rounds_and_a_rerun_only_redoes_what_is_missing(tmp_path):
    lin, said = _lineage(tmp_path, precision="fp32"), []
    summary = run_lineage(lin, TINY_RECIPE, log=said.append)
    data, runs = open_dataset(tmp_path / "data"), tmp_path / "runs"
    assert len(data.episodes) == 3
    dagger = data.episodes[2]
    assert dagger["driver"] == str(runs / "r0" / "best.pt") and dagger["beta"] == 0.5
    assert dagger["driver_actions"] == "sample"  # the round-0 student drives by the rule it was trained with
    first, second = load_checkpoint(runs / "r0" / "best.pt").config, load_checkpoint(runs / "r1" / "best.pt").config
    assert first.core == second.core == "mlp" and second.discrete_actions == "sample"
    assert json.loads((runs / "r1" / "args.json").read_text())["init"] == str(runs / "r0" / "best.pt")
    written = json.loads((runs / "lineage.json").read_text())
    assert written == summary and [r["episodes"] for r in written["rounds"]] == [2, 3]
    assert "--init" in written["rounds"][1]["train"] and "--beta 0.5" in written["rounds"][1]["collect"]
    assert "--precision fp32" in written["rounds"][1]["train"]  # the trainings run at the lineage's precision
    assert json.loads((runs / "r1" / "metrics.json").read_text())["precision"] == "fp32"

    stamp = (runs / "r1" / "last.pt").stat().st_mtime_ns
    run_lineage(lin, TINY_RECIPE, log=said.append)  # everything done: nothing collected or trained again
    assert len(open_dataset(tmp_path / "data").episodes) == 3
    assert (runs / "r1" / "last.pt").stat().st_mtime_ns == stamp

    for f in (runs / "r1").iterdir():  # the last round lost: retrained on the data it had, nothing collected
        f.unlink()
    run_lineage(lin, TINY_RECIPE, log=said.append)
    assert len(open_dataset(tmp_path / "data").episodes) == 3 and (runs / "r1" / "best.pt").exists()

    for f in (runs / "r1").iterdir():  # the last round killed before its first epoch ended: only args.json kept
        if f.name != "args.json":
            f.unlink()
    run_lineage(lin, TINY_RECIPE, log=said.append)  # trained over again, not "already holds a run"
    assert json.loads((runs / "r1" / "metrics.json").read_text())["history"][0]["epoch"] == 1

    with pytest.raises(ValueError, match="belongs to another lineage"):  # a fresh lineage on a used dataset
        run_lineage(_lineage(tmp_path, out=str(tmp_path / "other")), TINY_RECIPE, log=said.append)


@pytest.mark.parametrize("argv, message", [
    (["--core", "lsmt"], "unknown policy 'lsmt'"),
    (["--renderer", "fsat"], "--renderer must be one of"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
])
def test_cli_bad_input_is_one_line_before_anything_is_written(tmp_path, capsys, argv, message):
    code = main([*argv, "--data", str(tmp_path / "d"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "d").exists() and not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as e:
        main(["--recipe", "medium"])
    assert e.value.code == 2 and "invalid choice: 'medium'" in capsys.readouterr().err
