"""Evaluation videos: the upscaled frame with a HUD, the NAC attention panel, and CNN saliency.

Frame layout (RGB, every side a multiple of 16 so libx264 needs no padding):

    +-------------------------+-----------------------+
    |  frame x4 (384 x 384)   |  attention panel      |
    |  [+ saliency overlay]   |  W window frames, the |
    |                         |  last query's weights |
    +-------------------------+-----------------------+
    |  HUD (384 x 112): step, |  W x W attention map  |
    |  speed, return, progr., |  (all queries, heads  |
    |  scene, pedals, policy  |  averaged)            |
    |  / expert steer         |                       |
    +-------------------------+-----------------------+

The right column (256 px) exists only for NAC cores (``return_internals``); other policies and the
expert get a 384 x 480 video.

Saliency (``--saliency``), what the CNN looks at in the current frame:
* ``gradcam`` (default; the NAC paper's fig. 6 uses Grad-CAM): gradient of the decision (the steer
  output for continuous heads, the chosen action's log-probability for discrete ones) w.r.t. the last
  conv layer's activations, through the sequence core on the current window (older frames'
  embeddings held fixed); channel weights = mean gradient; map = |sum_c w_c A_c| (the magnitude
  rather than Grad-CAM's ReLU: for a signed steering value, regions that push left or right both
  matter), upsampled to the frame and scaled to max 1.
* ``visualbackprop`` (Bojarski et al. 2017, gradient-free): channel-averaged activations of every conv
  layer, multiplied from the deepest layer back to the input with bilinear upsampling in between.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common.files import disk_full

SCALE = 4  # 96 -> 384
HUD_H = 112
BAR_Y = (64, 88)  # top rows of the policy's and the expert's steering bars in the HUD
PANEL_W = 256
FONT = cv2.FONT_HERSHEY_SIMPLEX
WHITE, GREY, DARK = (235, 235, 235), (140, 140, 140), (24, 24, 28)
POLICY_COLOR, EXPERT_COLOR = (70, 150, 255), (255, 160, 40)  # RGB
SALIENCY_METHODS = ("gradcam", "visualbackprop")
# Less room than this left where a video is written when ffmpeg stops taking frames: the disk filled up (ffmpeg
# died of it; imageio says only that its pipe broke)
VIDEO_ROOM_BYTES = 32 * 2**20


def upscale(frame: np.ndarray, scale: int = SCALE) -> np.ndarray:
    """Nearest-neighbour upscaling: keeps the pixels the policy actually sees."""
    h, w = frame.shape[:2]
    return cv2.resize(frame, (w * scale, h * scale), interpolation=cv2.INTER_NEAREST)


def _text(img: np.ndarray, text: str, xy: tuple[int, int], scale: float = 0.45,
          color: tuple[int, int, int] = WHITE, thickness: int = 1) -> None:
    cv2.putText(img, text, xy, FONT, scale, color, thickness, cv2.LINE_AA)


def heat_colors(values: np.ndarray) -> np.ndarray:
    """[..., ] values in [0, 1] -> RGB uint8 [..., 3] (JET colormap)."""
    v = np.clip(np.nan_to_num(values), 0.0, 1.0)
    bgr = cv2.applyColorMap((v * 255).astype(np.uint8).reshape(-1, 1), cv2.COLORMAP_JET)
    return bgr[:, 0, ::-1].reshape(*v.shape, 3)


def overlay_heatmap(img: np.ndarray, heat: np.ndarray, alpha: float = 0.55) -> np.ndarray:
    """Blend a [h, w] map in [0, 1] over ``img``; transparent where the map is 0."""
    H, W = img.shape[:2]
    heat = cv2.resize(heat.astype(np.float32), (W, H), interpolation=cv2.INTER_LINEAR)
    colors = heat_colors(heat).astype(np.float32)
    a = (alpha * np.clip(heat, 0, 1))[..., None]
    return (img.astype(np.float32) * (1 - a) + colors * a).astype(np.uint8)


def _steer_bar(img: np.ndarray, y: int, label: str, value: float, limit: float,
               color: tuple[int, int, int]) -> None:
    """A bar from the centre line: right of it = steer right. Saturates (with a marker) at ``limit``."""
    x0, x1 = 80, img.shape[1] - 70
    cx, half = (x0 + x1) // 2, (x1 - x0) // 2
    _text(img, label, (8, y + 11), color=color)
    cv2.rectangle(img, (x0, y), (x1, y + 14), (60, 60, 66), -1)
    frac = float(np.clip(value / limit, -1.0, 1.0)) if np.isfinite(value) else 0.0
    end = cx + int(round(frac * half))
    cv2.rectangle(img, (min(cx, end), y + 2), (max(cx, end), y + 12), color, -1)
    if abs(value) > limit:
        cv2.rectangle(img, (end - 2 if frac > 0 else end, y), (end + 2 if frac < 0 else end, y + 14), WHITE, -1)
    cv2.line(img, (cx, y - 2), (cx, y + 16), WHITE, 1)
    _text(img, f"{value:+.2f}", (x1 + 6, y + 11), color=color)


def draw_hud(width: int, *, step: int, speed: float, ret: float, completion: float,
             policy_steer: float, expert_steer: float | None, steer_limit: float, expert_label: str = "expert",
             title: str = "", lateral_error: float | None = None, interventions: int | None = None,
             speed_unit: str = "m/s", pedals: str = "") -> np.ndarray:
    """The HUD strip: step / speed in its unit / return / progress (the env spec's: tiles, laps); the title (who
    drives, the seed, the scene) with the lane-keeping envs' cross-track error and interventions; ``pedals``, what
    the driver does besides steering (throttle, gas and brake, a discrete action); then the policy's and the
    expert's steering bars."""
    img = np.full((HUD_H, width, 3), DARK, np.uint8)
    _text(img, f"step {step:4d}   speed {speed:5.1f} {speed_unit}   return {ret:7.1f}   "
               f"progress {100 * completion:5.1f}%", (8, 18))
    extra = ("" if lateral_error is None else f"   |CTE| {lateral_error:.2f} m") + \
            ("" if interventions is None else f"   interventions {interventions}")
    if title or extra:
        _text(img, title + extra, (8, 38), scale=0.4, color=GREY)
    if pedals:
        _text(img, pedals, (8, 56), scale=0.4)
    _steer_bar(img, BAR_Y[0], "policy", policy_steer, steer_limit, POLICY_COLOR)
    if expert_steer is not None:
        _steer_bar(img, BAR_Y[1], expert_label, expert_steer, steer_limit, EXPERT_COLOR)
    return img


def window_attention(internals: dict[str, torch.Tensor], window: int) -> tuple[np.ndarray, np.ndarray]:
    """NAC internals -> (last query's weights over the W window frames [W], all queries [Tq, W]).

    ``attn`` and ``index`` are ``[B, H, Tq, K]`` (weights over the K selected keys and which keys they
    are; -1 marks filler slots, whose weight is 0). Weights are scattered back to window positions and
    averaged over heads; batch element 0 is used.
    """
    attn = internals["attn"][0].detach().float().cpu()  # [H, Tq, K]
    index = internals["index"][0].detach().cpu().long()
    dense = torch.zeros(*attn.shape[:2], window)
    dense.scatter_add_(-1, index.clamp(min=0), attn.masked_fill(index < 0, 0.0))
    full = dense.mean(0).numpy()  # [Tq, W]
    return full[-1], full


def attention_panel(thumbs: Sequence[np.ndarray] | None, weights: np.ndarray, times: Sequence[float],
                    full: np.ndarray | None, height: int, width: int = PANEL_W) -> np.ndarray:
    """Right-hand column: one row per window frame (newest on top) with its attention bar, then the map.

    Bars are scaled to the largest weight (the number printed is the weight itself); thumbnails are
    drawn when rows are at least 16 px tall.
    """
    img = np.full((height, width, 3), DARK, np.uint8)
    _text(img, "NAC attention, last query", (8, 16), scale=0.45)
    _text(img, "(mean over heads)", (8, 32), scale=0.4, color=GREY)
    top, bottom = 40, height - HUD_H
    W = len(weights)
    row = max(1, (bottom - top) // max(W, 1))
    wmax = float(np.max(weights)) if W and np.max(weights) > 0 else 1.0
    for r, i in enumerate(reversed(range(W))):  # newest frame first
        y = top + r * row
        x = 4
        if thumbs is not None and row >= 16:
            side = row - 4
            thumb = cv2.resize(thumbs[i], (side, side), interpolation=cv2.INTER_AREA)
            img[y + 2: y + 2 + side, x: x + side] = thumb
            x += side + 6
        if row >= 12:
            _text(img, f"{times[i]:+.2f}s", (x, y + row // 2 + 4), scale=0.38, color=GREY)
        bx = x + 52
        bar_w = width - bx - 46
        length = int(round(bar_w * float(weights[i]) / wmax))
        cv2.rectangle(img, (bx, y + row // 2 - 5), (bx + max(length, 1), y + row // 2 + 5), POLICY_COLOR, -1)
        if row >= 12:
            _text(img, f"{weights[i]:.2f}", (bx + bar_w + 4, y + row // 2 + 4), scale=0.38)
    if full is not None and full.size:
        side = HUD_H - 12
        m = full / max(float(full.max()), 1e-8)
        heat = cv2.resize(heat_colors(m), (side, side), interpolation=cv2.INTER_NEAREST)
        img[bottom + 6: bottom + 6 + side, 8: 8 + side] = heat
        _text(img, "all queries", (side + 18, bottom + 30), scale=0.4, color=GREY)
        _text(img, "rows: query", (side + 18, bottom + 50), scale=0.4, color=GREY)
        _text(img, "cols: key (old->new)", (side + 18, bottom + 70), scale=0.4, color=GREY)
    return img


def compose_frame(frame: np.ndarray, hud: np.ndarray, panel: np.ndarray | None = None,
                  saliency: np.ndarray | None = None) -> np.ndarray:
    """Stack the upscaled frame (+ saliency overlay) over the HUD, with the optional panel on the right."""
    view = upscale(frame)
    if saliency is not None:
        view = overlay_heatmap(view, saliency)
    left = np.concatenate([view, hud], axis=0)
    if panel is None:
        return left
    return np.concatenate([left, panel], axis=1)


def _activation_modules(encoder: nn.Module) -> list[nn.Module]:
    """The module whose output is each conv layer's (activated) feature map, in order.

    In ``encoder.modules()`` (depth-first) a conv in a Sequential is followed by its activation; take
    that activation when it has no parameters, else the conv itself.
    """
    mods = list(encoder.modules())
    picked = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Conv2d):
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            act = nxt is not None and not isinstance(nxt, nn.Conv2d) and not list(nxt.parameters()) \
                and not isinstance(nxt, (nn.Sequential, nn.Dropout))
            picked.append(nxt if act else m)
    if not picked:
        raise ValueError(f"saliency needs a convolutional encoder; {type(encoder).__name__} has no nn.Conv2d")
    return picked


def _capture(modules: Sequence[nn.Module]) -> tuple[list[torch.Tensor], Callable[[], None]]:
    store: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda _m, _i, out: store.append(out)) for m in modules]
    return store, lambda: [h.remove() for h in handles]


def _normalise(m: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    m = F.interpolate(m[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]
    m = m.clamp(min=0)
    top = float(m.max())
    return (m / top).cpu().numpy() if top > 0 else np.zeros(size, np.float32)


def saliency_map(policy: Any, frame: np.ndarray, window_emb: torch.Tensor, rel_time: torch.Tensor,
                 method: str = "gradcam") -> np.ndarray:
    """What the CNN looks at in ``frame`` (the newest frame of the window): a [H, W] map in [0, 1].

    ``window_emb`` [1, W, F] are the window's cached embeddings (the last replaced by a fresh,
    differentiable encoding of ``frame``), ``rel_time`` [1, W] seconds relative to the last frame.
    Uses only DrivingPolicy's public pieces: encoder, raw_from_embeddings, postprocess, config.
    """
    if method not in SALIENCY_METHODS:
        raise ValueError(f"saliency method must be one of {SALIENCY_METHODS}, got {method!r}")
    from policies.frames import frames_to_float

    size = tuple(frame.shape[:2])
    x = frames_to_float(torch.as_tensor(frame)[None, None], policy.config.image_size, policy.device)
    modules = _activation_modules(policy.encoder)
    if method == "visualbackprop":
        store, remove = _capture(modules)
        try:
            with torch.no_grad():
                policy.encoder(x)
        finally:
            remove()
        maps = [a[0].mean(0) for a in store]  # channel averages, shallow -> deep
        m = maps[-1]
        for shallower in reversed(maps[:-1]):
            m = F.interpolate(m[None, None], size=shallower.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
            m = m * shallower
        return _normalise(m, size)

    store, remove = _capture(modules[-1:])
    try:
        with torch.enable_grad():
            emb = policy.encoder(x)  # [1, 1, F]
            acts = store[0]
            window = torch.cat([window_emb[:, :-1].detach().to(emb.device), emb], dim=1)
            out = policy.postprocess(policy.raw_from_embeddings(window, rel_time.to(emb.device)))[0]
            if policy.config.head == "discrete":
                target = torch.log_softmax(out, -1)[int(out.argmax())]
            else:
                names = list(policy.config.action_names)
                target = out[names.index("steer") if "steer" in names else 0]
            grad, = torch.autograd.grad(target, acts)
    finally:
        remove()
    weights = grad[0].mean(dim=(1, 2))  # [C]
    cam = (weights[:, None, None] * acts[0].detach()).sum(0)
    # Magnitude, not ReLU: for a signed steering value, regions pushing left or right both matter, and
    # a small CNN's map is often entirely negative, which ReLU would turn into a blank frame.
    cam = cam.abs()
    return _normalise(cam, size)


def step_visuals(controller: Any, frame: np.ndarray,
                 saliency: str | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(attention panel image | None, saliency map | None) for the step a controller just took; the expert
    (no frames, no attention) has neither."""
    win = None if controller.is_expert else controller.window()
    if win is None:
        return None, None
    window, rel, seconds = win
    policy = controller.policy
    panel = None
    if controller.has_panel:
        W = window.shape[1]
        internals = policy.core.internals(policy.core_input(window), policy.core_time(rel.to(window.device), 1, W))
        if internals is not None and "attn" in internals and "index" in internals:
            last, full = window_attention(internals, W)
            thumbs = controller.window_frames()
            panel = attention_panel(thumbs, last, seconds, full, height=SCALE * frame.shape[0] + HUD_H)
    sal = saliency_map(policy, frame, window, rel, saliency) if saliency else None
    return panel, sal


def fps_of(dt: float) -> float:
    """The frame rate at which an episode's video plays in real time: one frame per env step of ``dt`` seconds."""
    return round(1.0 / dt, 3)


class VideoWriter:
    """mp4 (libx264, yuv420p) written to a hidden temp file and renamed on ``close()``, so an
    interrupted episode never leaves a half video. ``abort()`` discards it. ``fps``: the env's step rate
    (``fps_of``), so the video plays in real time."""

    def __init__(self, path: str | Path, fps: float) -> None:
        import imageio.v2 as imageio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".tmp-{os.getpid()}-{self.path.name}")  # keeps the .mp4 suffix
        self._writer = imageio.get_writer(str(self._tmp), format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                          pixelformat="yuv420p", macro_block_size=16, ffmpeg_log_level="error")
        self.frames = 0
        self.shape: tuple[int, ...] | None = None

    def append(self, img: np.ndarray) -> None:
        if self.shape is None:
            self.shape = img.shape
        elif img.shape != self.shape:
            raise ValueError(f"video frames must all have shape {self.shape}, got {img.shape}")
        try:
            self._writer.append_data(np.ascontiguousarray(img))
        except OSError as e:  # BrokenPipeError, or imageio's IOError around it
            full = self._disk_full(e)
            if full is e:
                raise
            raise full from e
        self.frames += 1

    def close(self) -> Path:
        try:
            self._writer.close()  # ffmpeg finishes encoding here: the longest moment for a Ctrl-C to land
            os.replace(self._tmp, self.path)
        except BaseException as e:
            self._tmp.unlink(missing_ok=True)  # an interrupted close leaves no half video either
            full = self._disk_full(e) if isinstance(e, OSError) else e
            if full is e:
                raise
            raise full from e
        return self.path

    def _disk_full(self, e: OSError) -> OSError:
        """``e``, or an ENOSPC error naming the video when the disk it is written to is (nearly) full: ffmpeg dies
        of a full disk, and what reaches Python is a broken pipe, which the commands would show as a traceback
        where a full disk is one line (common.cli)."""
        if disk_full(e):
            return e
        try:
            free = shutil.disk_usage(self.path.parent).free
        except OSError:
            return e
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) if free < VIDEO_ROOM_BYTES else e

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            if self._tmp.exists():
                self._tmp.unlink()
