"""A student between two (agent.training.interpolate): the ends are the two students, the middle is the mean of
their weights, a start that was not told its latency is widened first, and mistakes are one line."""
import pytest
import torch

from agent.training.interpolate import interpolate, main
from policies.config import PolicyConfig
from policies.checkpoint import load_checkpoint, save_checkpoint
from policies.policy import DrivingPolicy, with_latency_input

TINY = dict(encoder="carracing", image_size=[32, 32], feature_dim=16, window=4, frame_stride=2, core="gru",
            core_options={"hidden": 16})


def _policy(seed: int, latency_input: str = "none") -> DrivingPolicy:
    torch.manual_seed(seed)
    return DrivingPolicy(PolicyConfig.for_actions("continuous", **TINY, latency_input=latency_input)).eval()


def _answers(policy: DrivingPolicy, told: bool = True) -> torch.Tensor:
    torch.manual_seed(5)
    frames = torch.randint(0, 255, (2, 4, 32, 32, 3), dtype=torch.uint8)
    time = torch.tensor([[-0.12, -0.08, -0.04, 0.0]] * 2)
    with torch.no_grad():
        emb = policy.encode(frames)
        return policy.raw_from_embeddings(emb, time, *((0.1,) if told else ()))


def test_the_ends_are_the_two_students_and_the_middle_the_mean_of_their_weights():
    start = _policy(0)
    tuned = with_latency_input(start).eval()
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.1 * torch.randn_like(p))  # a fine-tune moved every weight, the latency input's too
    torch.testing.assert_close(_answers(interpolate(start, tuned, 1.0)), _answers(tuned))
    torch.testing.assert_close(_answers(interpolate(start, tuned, 0.0)), _answers(start, told=False))  # widened: 0s
    half = interpolate(start, tuned, 0.5).state_dict()
    wide = with_latency_input(start).state_dict()
    for key, value in tuned.state_dict().items():
        torch.testing.assert_close(half[key], (wide[key] + value) / 2)


def test_the_cli_writes_a_checkpoint_and_refuses_mistakes_in_one_line(tmp_path, capsys):
    start, other = _policy(0), _policy(1)
    tuned = with_latency_input(other)
    save_checkpoint(tmp_path / "start.pt", start)
    save_checkpoint(tmp_path / "tuned.pt", tuned)
    out = tmp_path / "mix.pt"
    assert main(["--start", str(tmp_path / "start.pt"), "--tuned", str(tmp_path / "tuned.pt"), "--weight", "0.25",
                 "--out", str(out)]) == 0
    mixed = load_checkpoint(out)
    assert mixed.config.latency_input == "input"
    wide, second = with_latency_input(start).state_dict(), tuned.state_dict()
    for key, value in mixed.state_dict().items():
        torch.testing.assert_close(value, 0.75 * wide[key] + 0.25 * second[key])
    capsys.readouterr()
    other_world = DrivingPolicy(PolicyConfig.for_actions("continuous", **{**TINY, "image_size": [40, 40]}))
    save_checkpoint(tmp_path / "other.pt", other_world)
    for argv, says in ((["--weight", "1.5"], "--weight must be in [0, 1]"),
                       (["--start", str(tmp_path / "other.pt")], "not the same network (image_size differ)"),
                       (["--start", str(tmp_path / "nothing.pt")], "does not exist")):
        args = {"--start": str(tmp_path / "start.pt"), "--tuned": str(tmp_path / "tuned.pt"), "--out": str(out)}
        args.update(dict(zip(argv[::2], argv[1::2])))
        assert main([w for kv in args.items() for w in kv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    with pytest.raises(SystemExit):
        main(["--tuned", str(tmp_path / "tuned.pt")])
