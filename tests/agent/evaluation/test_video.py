"""Video pieces: mp4 writer, HUD steering bars, NAC attention scatter, panel layout, saliency."""
from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from agent.evaluation import video as vid
from policies.config import PolicyConfig
from policies.policy import DrivingPolicy

TINY = dict(core_options=dict(d_model=16, heads=4, topk=4), window=4, frame_stride=2, feature_dim=16)


def test_video_writer_decodes_with_every_frame(tmp_path):
    path = tmp_path / "v" / "a.mp4"
    w = vid.VideoWriter(path, fps=vid.fps_of(0.1))
    frames = [np.full((96, 160, 3), 20 * i, np.uint8) for i in range(12)]
    for f in frames:
        w.append(f)
    assert not path.exists()  # only the hidden temp file until close()
    w.close()
    decoded = iio.imread(path)
    assert decoded.shape == (12, 96, 160, 3)
    assert np.abs(decoded.astype(int).mean(axis=(1, 2, 3)) - [20 * i for i in range(12)]).max() < 4
    assert list(path.parent.iterdir()) == [path]
    assert iio.immeta(path)["fps"] == 10.0  # a 10 Hz env's episode plays in real time


def test_video_writer_abort_and_shape_check(tmp_path):
    w = vid.VideoWriter(tmp_path / "b.mp4", 50)
    w.append(np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="shape"):
        w.append(np.zeros((48, 32, 3), np.uint8))
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_video_writer_ctrl_c_during_close_leaves_no_file(tmp_path):
    """Ctrl-C while ffmpeg finishes the file (the close at the end of an episode) must not leave its temp file."""
    w = vid.VideoWriter(tmp_path / "c.mp4", 50)
    w.append(np.zeros((32, 32, 3), np.uint8))
    finish = w._writer.close
    calls = []

    def interrupted_close():  # only the first close is interrupted: the reader's __del__ closes it again later
        finish()
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    w._writer.close = interrupted_close
    with pytest.raises(KeyboardInterrupt):
        w.close()
    assert list(tmp_path.iterdir()) == []


def _bar_pixels(hud: np.ndarray, y: int, color) -> np.ndarray:
    """x coordinates of the bar colour in the bar row at height y+7."""
    return np.flatnonzero(np.all(hud[y + 7] == np.array(color, np.uint8), axis=-1))


def test_hud_steering_bars_point_the_right_way():
    hud = vid.draw_hud(384, step=3, speed=12.0, ret=5.0, completion=0.1, policy_steer=0.2,
                       expert_steer=-0.3, steer_limit=0.4)
    assert hud.shape == (vid.HUD_H, 384, 3)
    x0, x1 = 80, 384 - 70
    cx, half = (x0 + x1) // 2, (x1 - x0) // 2
    pol = _bar_pixels(hud, vid.BAR_Y[0], vid.POLICY_COLOR)
    exp = _bar_pixels(hud, vid.BAR_Y[1], vid.EXPERT_COLOR)
    pol, exp = pol[(pol > x0) & (pol < x1)], exp[(exp > x0) & (exp < x1)]
    assert pol.min() >= cx and pol.max() == pytest.approx(cx + 0.5 * half, abs=2)  # right, half scale
    assert exp.max() <= cx and exp.min() == pytest.approx(cx - 0.75 * half, abs=2)  # left, 3/4 scale
    no_expert = vid.draw_hud(384, step=0, speed=0, ret=0, completion=0, policy_steer=0.0,
                             expert_steer=None, steer_limit=1.0)
    assert len(_bar_pixels(no_expert, vid.BAR_Y[1], vid.EXPERT_COLOR)) == 0


def test_hud_pedal_line_is_drawn_only_when_the_driver_has_pedals():
    kw = dict(step=0, speed=3.0, ret=0, completion=0, policy_steer=0, expert_steer=0, steer_limit=1.0)
    rows = slice(46, 60)  # the pedal line, between the title and the steering bars
    steer_only = vid.draw_hud(384, **kw)
    assert (steer_only[rows] == vid.DARK).all()
    assert (vid.draw_hud(384, pedals="throttle +0.40", **kw)[rows] != vid.DARK).any()


@pytest.mark.parametrize("names, space, action, expert, filled, text", [
    (("steer", "throttle"), "continuous", [0.1, 0.27], [0.0, 0.4], (), "throttle +0.27   expert: throttle +0.40"),
    (("steer", "gas", "brake"), "continuous", [0.1, 0.8, 0.0], None, (), "gas +0.80  brake +0.00"),
    (("steer", "gas", "brake"), "continuous", [0.1, 0.8, 0.0], None, ("gas", "brake"),
     "gas +0.80 (the expert's)  brake +0.00 (the expert's)"),
    (("noop", "right", "left", "gas", "brake"), "discrete", 3, 2, (), "action gas   expert: left"),
    (("steer",), "continuous", [0.2], [0.1], (), ""),  # a replay: steering alone
    (("steer", "throttle"), "continuous", [0.2], [0.1], (), ""),  # a PI-held speed: the env takes [steer]
])
def test_pedals_name_what_the_driver_does_besides_steering(names, space, action, expert, filled, text):
    from agent.evaluation.episode import pedals_text

    assert pedals_text(names, space, action, expert, filled) == text


def test_window_attention_scatters_selected_keys_and_averages_heads():
    # B=1, H=2, Tq=1, K=2 over a window of 4: head 0 -> keys 3, 1; head 1 -> key 2 and a filler slot.
    attn = torch.tensor([[[[0.75, 0.25]], [[1.0, 0.0]]]])
    index = torch.tensor([[[[3, 1]], [[2, -1]]]])
    last, full = vid.window_attention({"attn": attn, "index": index}, window=4)
    np.testing.assert_allclose(last, [0.0, 0.125, 0.5, 0.375])
    assert full.shape == (1, 4) and last.sum() == pytest.approx(1.0)


def test_layout_sides_are_multiples_of_16():
    frame = np.zeros((96, 96, 3), np.uint8)
    hud = vid.draw_hud(384, step=0, speed=0, ret=0, completion=0, policy_steer=0, expert_steer=0, steer_limit=0.4)
    thumbs = [np.full((96, 96, 3), 30 * i, np.uint8) for i in range(8)]
    panel = vid.attention_panel(thumbs, np.linspace(0.05, 0.2, 8), [-0.02 * i for i in range(7, -1, -1)],
                                np.tril(np.ones((8, 8))) / 8, height=496)
    img = vid.compose_frame(frame, hud, panel, saliency=np.ones((96, 96)))
    assert img.shape == (496, 640, 3) and img.dtype == np.uint8
    assert vid.compose_frame(frame, hud).shape == (496, 384, 3)
    # The newest frame (index 7, brightest thumbnail) sits in the top row of the panel.
    assert panel[45:80, 10:40].mean() > panel[400 - 60:400 - 30, 10:40].mean()


def test_overlay_is_transparent_where_the_map_is_zero():
    img = np.full((64, 64, 3), 100, np.uint8)
    heat = np.zeros((16, 16))
    np.testing.assert_array_equal(vid.overlay_heatmap(img, heat), img)
    heat[:, 8:] = 1.0
    out = vid.overlay_heatmap(img, heat)
    assert np.array_equal(out[:, :20], img[:, :20]) and not np.array_equal(out[:, 44:], img[:, 44:])


@pytest.mark.parametrize("head", ["continuous", "discrete"])
def test_saliency_maps_follow_the_decision(head):
    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig.for_actions(head, **TINY)).eval()
    frame = (np.random.default_rng(0).random((96, 96, 3)) * 255).astype(np.uint8)
    window = torch.randn(1, 4, 16)
    rel = torch.tensor([[-0.12, -0.08, -0.04, 0.0]])
    for method in vid.SALIENCY_METHODS:
        m = vid.saliency_map(policy, frame, window, rel, method)
        assert m.shape == (96, 96) and np.isfinite(m).all() and m.min() >= 0 and m.max() == pytest.approx(1.0)
    # Grad-CAM explains the decision: a head that ignores its input has nothing to explain.
    with torch.no_grad():
        policy.head.weight.zero_()
    assert np.all(vid.saliency_map(policy, frame, window, rel, "gradcam") == 0)
    with pytest.raises(ValueError, match="saliency method"):
        vid.saliency_map(policy, frame, window, rel, "lime")


def test_a_broken_pipe_on_a_full_disk_is_the_disk_full_error_naming_the_video(tmp_path, monkeypatch):
    """ffmpeg dies when the disk fills up and imageio says only that its pipe broke: with (almost) no room left
    where the video goes, the writer says ENOSPC and names the video; with room left, the error stays what it was."""
    import errno
    import shutil
    from collections import namedtuple

    w = vid.VideoWriter(tmp_path / "c.mp4", 10)
    monkeypatch.setattr(w._writer, "append_data", lambda img: (_ for _ in ()).throw(BrokenPipeError(32, "Broken pipe")))
    with pytest.raises(BrokenPipeError):  # room left: not a full disk
        w.append(np.zeros((32, 32, 3), np.uint8))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 4096))
    with pytest.raises(OSError) as e:
        w.append(np.zeros((32, 32, 3), np.uint8))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "c.mp4")
    assert isinstance(e.value.__cause__, BrokenPipeError)
    w.abort()
    assert list(tmp_path.iterdir()) == []
