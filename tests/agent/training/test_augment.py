"""agent/training/augment.py: the shift that replicates edge pixels, one augmentation draw per segment, and the
colour maps that keep grey grey."""
import torch

from agent.training.augment import augment, color_jitter_matrices, shift_


def test_shift_moves_the_frame_and_replicates_its_edges():
    frames = torch.arange(2 * 4 * 5 * 3, dtype=torch.uint8).view(2, 4, 5, 3)
    out = shift_(torch.empty_like(frames), frames, 1, -2)  # one row down, two columns left
    assert torch.equal(out[:, 1:, :3], frames[:, :3, 2:])
    assert torch.equal(out[:, 0], out[:, 1]), "the top row is the first shifted row repeated"
    assert torch.equal(out[:, :, 3], out[:, :, 2]) and torch.equal(out[:, :, 4], out[:, :, 2])
    assert torch.equal(shift_(torch.empty_like(frames), frames, 0, 0), frames)


def test_augment_draws_once_per_segment():
    torch.manual_seed(0)
    frame = torch.randint(0, 255, (1, 16, 16, 3), dtype=torch.uint8)
    frames = frame.repeat(6, 1, 1, 1)  # two segments of three copies of one frame
    x = augment(frames, [(0, 3), (3, 6)], [16, 16], torch.device("cpu"))
    assert x.shape == (6, 3, 16, 16) and x.dtype == torch.float32
    assert torch.equal(x[0], x[1]) and torch.equal(x[0], x[2]), "a segment's frames share one draw"
    assert not torch.equal(x[0], x[3]), "another segment draws again"
    assert (x.mean() - frames.float().mean() / 255).abs() < 0.15  # brightness +-0.1, contrast around mid-grey


def test_colour_jitter_keeps_grey_grey_and_changes_colours():
    torch.manual_seed(0)
    maps = color_jitter_matrices(64, 0.5)
    assert maps.shape == (64, 3, 3)
    grey = torch.full((3,), 0.4)
    torch.testing.assert_close(maps @ grey, grey.expand(64, 3), atol=1e-5, rtol=0)
    red = torch.tensor([0.8, 0.1, 0.1])
    assert (maps @ red - red).abs().amax() > 0.1
    torch.testing.assert_close(color_jitter_matrices(4, 0.0), torch.eye(3).expand(4, 3, 3), atol=1e-5, rtol=0)
