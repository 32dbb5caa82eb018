"""Camera frames on their way into a driving policy: the one frame-size rule (``check_frame_shape``), the crop and
resize the trainer stores frames at (``prepare_frames``) and the conversion to network input (``frames_to_float``,
``to_color_space``).

Its own module because these are the rules where a policy meets camera frames, shared by the trainer, the offline
scores, the closed loops and the bridge, none of which needs the network to apply them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

# RGB -> YUV (BT.601, as OpenCV's COLOR_RGB2YUV) on [0, 1] pixels, U and V centred on 0.5
_YUV = torch.tensor([[0.299, 0.587, 0.114], [-0.14713, -0.28886, 0.436], [0.615, -0.51499, -0.10001]])


def check_frame_shape(trained: Sequence[int], frames: Sequence[int], who: str, what: str) -> None:
    """The one rule where a policy meets camera frames (offline scores, the replay and every closed loop, the
    bridge): frames of another size than it was trained on are refused in one line, never cropped and resized into
    a view it never saw (a 160x320 crop of a 480-row frame is sky)."""
    if tuple(int(x) for x in frames) != tuple(int(x) for x in trained):
        raise ValueError(f"{who} was trained on {'x'.join(map(str, trained))} frames; {what} are "
                         f"{'x'.join(map(str, frames))} (height x width x channels): a policy never scores or drives "
                         "frames of another size")


def prepare_frames(frames: np.ndarray, crop: list[int] | None, image_size: list[int] | tuple[int, int]) -> np.ndarray:
    """Camera frames uint8 ``[..., H, W, 3]`` -> the encoder's size: keep rows ``crop`` (sky and bonnet off),
    then an area resize to ``image_size`` (OpenCV, as PilotNet's recipe). Identity when nothing changes, so
    the trainer can store prepared frames (a 160x320 camera frame shrinks 3.9x at 66x200)."""
    import cv2

    frames = np.asarray(frames)
    if crop is not None:
        frames = frames[..., crop[0]:crop[1], :, :]
    h, w = int(image_size[0]), int(image_size[1])
    if frames.shape[-3:-1] == (h, w):
        return np.ascontiguousarray(frames)
    flat = frames.reshape(-1, *frames.shape[-3:])
    out = np.empty((len(flat), h, w, 3), dtype=frames.dtype)
    for i, f in enumerate(flat):
        out[i] = cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA)
    return out.reshape(*frames.shape[:-3], h, w, 3)


def to_color_space(x: torch.Tensor, color: str) -> torch.Tensor:
    """Float RGB ``[..., 3, h, w]`` in [0, 1] -> the encoder's colour space (in place of a copy for yuv)."""
    if color == "rgb":
        return x
    m = _YUV.to(x.device, x.dtype)
    yuv = torch.einsum("ij,...jhw->...ihw", m, x)
    yuv[..., 1:, :, :] += 0.5
    return yuv


def frames_to_float(frames: torch.Tensor | np.ndarray, image_size: list[int] | tuple[int, int],
                    device: torch.device | str | None = None, color: str = "rgb") -> torch.Tensor:
    """The one place where frames become network input: ``[..., H, W, 3]`` -> float ``[..., 3, h, w]`` in [0, 1].

    uint8 frames are divided by 255; float frames are taken as already in [0, 1]. Frames whose size is
    not ``image_size`` are resized (bilinear, antialiased). ``color="yuv"`` converts to YUV last.
    """
    frames = torch.as_tensor(frames, device=device)
    if frames.dim() < 3 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [..., H, W, 3] (channels last), got shape {tuple(frames.shape)}")
    lead = frames.shape[:-3]
    # NHWC -> NCHW as a permuted view: the memory stays channels-last, which the CPU convolutions
    # run ~1.5x faster on than a contiguous NCHW copy
    x = frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2)
    x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
    if list(x.shape[-2:]) != list(image_size):
        x = F.interpolate(x, size=tuple(image_size), mode="bilinear", align_corners=False, antialias=True)
    return to_color_space(x, color).view(*lead, 3, *image_size)
