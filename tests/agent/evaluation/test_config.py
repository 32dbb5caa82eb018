"""agent/evaluation/config.py: the configs ``resolve`` makes of evaluate.py's arguments (defaults filled once), the
seeds of a run, and the last run's results cleared from its --out."""
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.controllers import shipped_checkpoint
from agent.evaluation.args import EvalArgs
from agent.evaluation.config import _seeds, clear_results, resolve
from envs.registry import get_spec


def test_resolve_fills_the_defaults_of_a_closed_loop_run_once():
    spec = get_spec("carracing")
    plan = resolve(EvalArgs(checkpoint=["runs/a/best.pt", "runs/b/best.pt"], episodes=3, latency_steps=2,
                            workers=4, out="eval/x", device="cpu"))
    d, w = plan.drivers, plan.track
    assert d.checkpoints == ("runs/a/best.pt", "runs/b/best.pt") and d.names == ()
    assert d.names_of(list(d.checkpoints)) == ["a_best", "b_best"]  # the stems made unique by their folders
    assert w.seeds == (spec.seeds.evaluate, spec.seeds.evaluate + 1, spec.seeds.evaluate + 2)
    assert w.max_steps == spec.default_max_steps and w.make_kwargs == spec.scene(None, None)
    assert plan.conditions.told_latency_s == pytest.approx(2 * spec.dt)  # told what it drives under, by default
    assert plan.conditions.timing.latency_steps == 2
    assert (plan.runtime.device, plan.runtime.workers) == ("cpu", 4)
    assert plan.outputs.out == Path("eval/x") and plan.outputs.video_episodes == 1 and plan.outputs.imported == ()


def test_resolve_picks_the_shipped_student_and_never_more_workers_than_episodes():
    plan = resolve(EvalArgs(episodes=2, workers=8, name=["mine!"], told_latency_steps=0, latency_steps=3,
                            video=False, seed=7))
    assert plan.drivers.checkpoints == (str(shipped_checkpoint("carracing")),)
    assert plan.drivers.names == ("mine",) and plan.outputs.out == Path("eval/mine")  # folder-safe
    assert plan.track.seeds == (7, 8) and plan.runtime.workers == 2
    assert plan.conditions.told_latency_s == 0.0 and plan.outputs.video_episodes == 0
    expert = resolve(EvalArgs(expert_drives=True, episodes=1, workers=3))
    assert expert.drivers.checkpoints == () and expert.runtime.workers == 1
    assert expert.outputs.out == Path("eval/expert")


def test_seeds_of_an_env_and_of_a_replay_s_parts():
    env = SimpleNamespace(seeds=SimpleNamespace(evaluate=1000), parts=None)
    assert _seeds(None, None, env, None, None) == (1000, 5)
    assert _seeds(3, 2, env, None, None) == (3, 2)
    replay = SimpleNamespace(seeds=SimpleNamespace(evaluate=0), parts=lambda span: 4 if span is None else 0)
    assert _seeds(None, None, replay, "rec", None) == (0, 4)  # every part by default
    assert _seeds(1, None, replay, "rec", None) == (1, 3)  # the parts from the first seed on
    with pytest.raises(ValueError, match=r"has 4 part\(s\) \(seeds 0..3\); --seed 3 --episodes 2 asks for more"):
        _seeds(3, 2, replay, "rec", None)
    with pytest.raises(ValueError, match="--episodes must be an integer >= 1"):
        _seeds(4, None, replay, "rec", None)
    with pytest.raises(ValueError, match="has no session of at least .* in the span 0.5:1"):
        _seeds(None, None, replay, "rec", "0.5:1")


def _results(folder: Path, mark: str | None) -> Path:
    folder.mkdir(parents=True)
    if mark:
        (folder / mark).write_text("{}")
    for name in ("videos", "tb", "paths"):
        (folder / name).mkdir()
        (folder / name / "x").write_text("")
    (folder / "steering_0.png").write_bytes(b"")
    (folder / "notes.txt").write_text("kept")
    return folder


def test_clear_results_removes_only_the_last_run_s_outputs_of_evaluate_py_folders(tmp_path):
    out = _results(tmp_path / "out", "metrics.json")
    policy = _results(out / "student", "episodes.csv")
    foreign = _results(out / "not_ours", None)  # no file of evaluate.py in it: someone else's folder
    imported = _results(out / "imported_data", "metrics.json")  # recordings kept for reuse
    elsewhere = _results(tmp_path / "elsewhere", None)
    linked = out / "linked"
    linked.mkdir()
    (linked / "metrics.json").write_text("{}")
    (linked / "videos").symlink_to(elsewhere / "videos")  # a link is not followed out of --out
    clear_results(out)
    assert (linked / "videos").is_symlink()
    for folder in (out, policy):
        assert sorted(p.name for p in folder.iterdir() if p.is_file()) == sorted(
            ["notes.txt", "metrics.json" if folder == out else "episodes.csv"])
        assert not any((folder / name).exists() for name in ("videos", "tb", "paths"))
    for folder in (foreign, imported, elsewhere):
        assert (folder / "videos" / "x").exists() and (folder / "steering_0.png").exists()


def test_resolve_claims_its_out_and_clears_the_last_results_there(tmp_path):
    out = _results(tmp_path / "eval", "metrics.json")
    with ExitStack() as claim:
        resolve(EvalArgs(episodes=1, out=str(out)), claim=claim)
        assert (out / ".lock").exists() and not (out / "videos").exists()
        with pytest.raises(ValueError, match="another"):  # a second evaluate.py on the same --out is refused
            resolve(EvalArgs(episodes=1, out=str(out)), claim=ExitStack())
    assert (out / "metrics.json").exists()
