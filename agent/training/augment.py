"""Camera augmentations for training.

Augmentation (training only; one draw per segment, the same for all its frames, like a camera that
is a little off for a while):
* top-down envs (CarRacing): brightness +-0.1, contrast x[0.8, 1.2], translation up to 4% of the
  image side (edge pixels replicated). No horizontal flips: a mirrored frame would need a mirrored
  steering label and CarRacing's HUD is not symmetric, so flips would teach wrong pairs.
* first-person envs (udacity; ``augment_first_person``), the PilotNet/Udacity recipe, each switchable:
  left/right cameras with a steering correction (``--side-correction``), mirrors with negated steering
  (``--flip``), sideways shifts with a steering shift per pixel (``--shift-steer``), brightness, and
  random shadows (``--shadows``), and colour jitter (``--color-jitter``: hue, saturation, grey); recovery views
  (``--recovery-views``, agent/training/recovery.py) come first. Validation always scores the center camera,
  unaugmented.
"""
from __future__ import annotations

import numpy as np
import torch

from agent.training.config import Augmentation, Windows
from agent.training.data import Data
from agent.training.recovery import RecoveryViews
from agent.training.windows import gather_segments
from policies.frames import _YUV, frames_to_float, to_color_space


def color_jitter_matrices(n: int, strength: float) -> torch.Tensor:
    """``n`` random 3x3 RGB -> RGB colour maps ``[n, 3, 3]``: in YUV, the chroma (U, V) is turned by an angle in
    +-strength*pi and scaled by a saturation in [1 - strength, 1 + strength], or set to 0 (grey) with probability
    strength / 2; luma is kept, so greys stay grey and the light of the scene stays where it was."""
    r = torch.rand(n, 3)
    angle = (2 * r[:, 0] - 1) * strength * torch.pi
    saturation = torch.where(r[:, 2] < strength / 2, torch.zeros(n), 1 + (2 * r[:, 1] - 1) * strength)
    chroma = torch.zeros(n, 3, 3)
    chroma[:, 0, 0] = 1.0
    chroma[:, 1, 1] = chroma[:, 2, 2] = saturation * torch.cos(angle)
    chroma[:, 2, 1] = saturation * torch.sin(angle)
    chroma[:, 1, 2] = -chroma[:, 2, 1]
    return torch.linalg.inv(_YUV) @ chroma @ _YUV


def shift_(out: torch.Tensor, frames: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Translate uint8 frames ``[n, H, W, 3]`` by (dy, dx) pixels into ``out``, edge rows/columns replicated."""
    H, W = frames.shape[1:3]
    rows = torch.empty_like(frames)
    rows[:, max(dy, 0): H + min(dy, 0)] = frames[:, max(-dy, 0): H - max(dy, 0)]
    if dy > 0:
        rows[:, :dy] = rows[:, dy: dy + 1]
    elif dy < 0:
        rows[:, H + dy:] = rows[:, H + dy - 1: H + dy]
    out[:, :, max(dx, 0): W + min(dx, 0)] = rows[:, :, max(-dx, 0): W - max(dx, 0)]
    if dx > 0:
        out[:, :, :dx] = out[:, :, dx: dx + 1]
    elif dx < 0:
        out[:, :, W + dx:] = out[:, :, W + dx - 1: W + dx]
    return out


def augment(frames: torch.Tensor, slices: list[tuple[int, int]], image_size: list[int],
            device: torch.device, color: str = "rgb") -> torch.Tensor:
    """uint8 frames ``[N, H, W, 3]`` -> augmented float network input ``[N, 3, h, w]``.

    One draw per segment: a translation of up to 4% of the side (edge pixels replicated; done on
    uint8, where it is cheap), then contrast x[0.8, 1.2] around mid-grey and brightness +-0.1
    (not clipped back to [0, 1]: a clamp costs another pass and the CNN does not need it).
    """
    N, H, W = frames.shape[:3]
    max_dy, max_dx = max(1, round(0.04 * H)), max(1, round(0.04 * W))
    r = torch.rand(len(slices), 4)
    shifted = torch.empty_like(frames)
    for (s, e), (_, _, ry, rx) in zip(slices, r.tolist()):
        shift_(shifted[s:e], frames[s:e], round((2 * ry - 1) * max_dy), round((2 * rx - 1) * max_dx))
    lengths = torch.tensor([e - s for s, e in slices])
    contrast = (0.8 + 0.4 * r[:, 0]).repeat_interleave(lengths).view(N, 1, 1, 1).to(device)
    brightness = ((r[:, 1] - 0.5) * 0.2).repeat_interleave(lengths).view(N, 1, 1, 1).to(device)
    x = frames_to_float(shifted, image_size, device)
    return to_color_space(x.mul_(contrast).add_(0.5 - 0.5 * contrast + brightness), color)


def augment_first_person(data: Data, segments: list[tuple[int, int, int]], aug: Augmentation, w: Windows,
                         cols: slice | None, color: str, device: torch.device, recovery: RecoveryViews | None = None,
                         shifts: list[np.ndarray] | None = None
                         ) -> tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """The Udacity/PilotNet recipe, one draw per segment (every window of a segment sees the same camera):
    a random camera of the three (left: steering + side_correction, right: - side_correction), a mirror
    with probability 0.5 (steering negated), a sideways shift of up to 50 camera pixels (steering +=
    shift_steer per pixel; a road shifted right means the car sits left of its line) and up to 5 rows,
    brightness x[0.8, 1.2], a random slanted shadow darkening one side of the frame to 50-80 % and, with
    ``aug.color_jitter`` > 0, a colour map per segment (``color_jitter_matrices``). With ``recovery``
    (--recovery-views), a share of the segments is first reprojected off the path and relabelled
    (agent.training.recovery; a side camera from its own pose, in place of the side correction).
    Returns the network input, the window index and times (as gather_segments) and the adjusted targets."""
    cams = ["center", *data.side_frames]
    n_seg = len(segments)
    r = torch.rand(n_seg, 8)
    cameras = [cams[min(int(u * len(cams)), len(cams) - 1)] for u in r[:, 0].tolist()]
    frames, slices, index, times, target = gather_segments(data, segments, w.window, w.frame_stride, cols, cameras,
                                                           w.window_gaps, shifts)
    target = target.copy()
    recovered = (recovery.apply_(frames, target, segments, slices, data.speeds, cameras) if recovery is not None
                 else [False] * n_seg)  # its own draws, so runs without it keep their random stream
    frames = torch.from_numpy(frames)
    h, w = frames.shape[1:3]
    px = w / max(data.camera_width, 1)  # encoder pixels per camera pixel
    windows = torch.tensor([b - s for _, s, b in segments])
    steer = target[:, 0]  # the steering column (first of the env's continuous action)
    out = torch.empty_like(frames)
    shadow_side = torch.zeros(n_seg, dtype=torch.bool)
    for k, ((s, e), cam, rr) in enumerate(zip(slices, cameras, r.tolist())):
        delta = 0.0
        if cam != "center" and not recovered[k]:  # a reprojected side camera is labelled from its own pose
            delta += aug.side_correction if cam == "left" else -aug.side_correction
        dx = round((2 * rr[2] - 1) * 50 * px) if aug.shift_steer > 0 else 0
        dy = round((2 * rr[3] - 1) * 5 * px) if aug.shift_steer > 0 else 0
        delta += aug.shift_steer * dx / px
        shift_(out[s:e], frames[s:e], dy, dx)
        flip = aug.flip and rr[1] < 0.5
        if flip:
            out[s:e] = out[s:e].flip(2)
        lo = int(windows[:k].sum())
        hi = lo + int(windows[k])
        steer[lo:hi] = np.clip(steer[lo:hi] + delta, -1.0, 1.0) * (-1.0 if flip else 1.0)
        shadow_side[k] = rr[7] < 0.5
    lengths = torch.tensor([e - s for s, e in slices])
    x = frames_to_float(out, data.image_size, device)
    gain = (0.8 + 0.4 * r[:, 4]).repeat_interleave(lengths).view(-1, 1, 1, 1).to(device)
    x.mul_(gain)
    if aug.color_jitter:  # its own draws, so runs without it keep their random stream
        maps = color_jitter_matrices(n_seg, aug.color_jitter).repeat_interleave(lengths, dim=0).to(device, x.dtype)
        x = torch.einsum("nij,njhw->nihw", maps, x)
    if aug.shadows:
        # a line from (x0, top) to (x1, bottom); one side of it is darkened, in half of the segments
        cols_ = torch.arange(w, device=device).view(1, 1, w).float()
        rows_ = torch.linspace(0, 1, h, device=device).view(1, h, 1)
        x0 = (r[:, 5] * w).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        x1 = (r[:, 6] * w).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        left = shadow_side.repeat_interleave(lengths).view(-1, 1, 1).to(device)
        edge = x0 + (x1 - x0) * rows_
        region = torch.where(left, cols_ < edge, cols_ >= edge)
        on = (r[:, 7] < 0.5).repeat_interleave(lengths).view(-1, 1, 1).to(device) & region
        dark = (0.5 + 0.3 * r[:, 3]).repeat_interleave(lengths).view(-1, 1, 1).to(device)
        x.mul_(torch.where(on, dark, torch.ones_like(dark)).unsqueeze(1))
    return to_color_space(x.clamp_(0.0, 1.0), color), index, times, target
