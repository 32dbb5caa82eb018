"""Frame encoders: small CNNs applied to every frame of a window independently (TimeDistributed).

The policy converts frames once (uint8 ``[B, T, H, W, 3]`` -> float ``[B, T, 3, H, W]`` in ``[0, 1]``,
see ``policies.frames.frames_to_float``); an encoder folds time into the batch, runs its CNN on
``[B*T, 3, H, W]`` and unfolds the result to ``[B, T, feature_dim]``. Because every frame is encoded
on its own, a streaming policy can encode each new frame once and reuse the embedding for every
window it belongs to.

Encoders (registry ``ENCODERS``):

* ``carracing`` -- the CNN of the NAC paper's CarRacing experiment: conv 10@3x3/2, 20@5x5/2,
  30@5x5/2, ReLU after each, dropout 0.2, flatten, linear to ``feature_dim``. Small on purpose:
  about 4 M multiply-adds per 96x96 frame, so training fits a 2-core CPU.
* ``pilotnet`` -- NVIDIA PilotNet (Bojarski et al. 2016): input normalisation to ``[-1, 1]``, conv
  24@5x5/2, 36@5x5/2, 48@5x5/2, 64@3x3, 64@3x3, ELU, flatten, linear to ``feature_dim``. Designed
  for 66x200 first-person camera frames; any input of at least 31x31 works (96x96 included).

* ``carracing-official``, ``pilotnet-official`` -- the same convolution stacks as the authors' public trainers
  build them (docs/usage.md, "The paper's experiments as presets"): no projection, the conv map flattened
  channels-last (as Keras flattens it) is the frame's feature (2430 values for a 96x96 CarRacing frame, 1152 =
  1x18x64 for a 66x200 PilotNet one), Keras's initialisation (Glorot-uniform kernels, zero biases). CarRacing's
  reads raw 0..255 pixels and drops out 0.2 after every convolution; PilotNet's scales pixels to ``[-1, 1]`` and
  has no dropout. ``feature_dim`` and ``dropout`` are not read: their trainers fix both.

The flattened size is measured with a dummy frame at construction, so the image size is free.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


class TimeDistributed(nn.Module):
    """Run a per-frame CNN on ``[B, T, C, H, W]`` by folding time into the batch -> ``[B, T, F]``."""

    def __init__(self, image_size: tuple[int, int], feature_dim: int):
        super().__init__()
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.feature_dim = int(feature_dim)

    def frame_features(self, x: torch.Tensor) -> torch.Tensor:  # [N, 3, H, W] -> [N, F]
        raise NotImplementedError

    def forward(self, frames: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
        """``channels_last``: lay the frames out channels-last first (bf16 convolutions run fastest on it)."""
        if frames.dim() != 5 or frames.shape[2] != 3 or tuple(frames.shape[-2:]) != self.image_size:
            raise ValueError(
                f"encoder expects float frames [B, T, 3, {self.image_size[0]}, {self.image_size[1]}]; "
                f"got shape {tuple(frames.shape)}")
        B, T = frames.shape[:2]
        x = frames.reshape(B * T, *frames.shape[2:])
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.frame_features(x).view(B, T, self.feature_dim)


def _flat_size(convs: nn.Module, image_size: tuple[int, int], name: str, minimum: str) -> int:
    try:
        with torch.no_grad():
            return int(convs(torch.zeros(1, 3, *image_size)).numel())
    except RuntimeError:
        raise ValueError(f"encoder {name!r}: image_size {tuple(image_size)} is too small; "
                         f"it needs at least {minimum} pixels") from None


class CarRacingCNN(TimeDistributed):
    """The NAC paper's CarRacing CNN (see the module docstring)."""

    def __init__(self, image_size: tuple[int, int] = (96, 96), feature_dim: int = 64, dropout: float = 0.2):
        super().__init__(image_size, feature_dim)
        self.convs = nn.Sequential(
            nn.Conv2d(3, 10, 3, stride=2), nn.ReLU(),
            nn.Conv2d(10, 20, 5, stride=2), nn.ReLU(),
            nn.Conv2d(20, 30, 5, stride=2), nn.ReLU(),
        )
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(_flat_size(self.convs, self.image_size, "carracing", "27x27"), feature_dim)

    def frame_features(self, x: torch.Tensor) -> torch.Tensor:
        x = x - 0.5  # centre [0, 1] pixels around zero
        return self.proj(self.dropout(self.convs(x).flatten(1)))


class PilotNet(TimeDistributed):
    """NVIDIA PilotNet's convolutional trunk (see the module docstring)."""

    def __init__(self, image_size: tuple[int, int] = (66, 200), feature_dim: int = 64, dropout: float = 0.2):
        super().__init__(image_size, feature_dim)
        self.convs = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),
            nn.Conv2d(48, 64, 3), nn.ELU(),
            nn.Conv2d(64, 64, 3), nn.ELU(),
        )
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Sequential(
            nn.Linear(_flat_size(self.convs, self.image_size, "pilotnet", "61x61"), feature_dim), nn.ELU())

    def frame_features(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2.0 - 1.0  # PilotNet's normalisation layer: pixels to [-1, 1]
        return self.proj(self.dropout(self.convs(x).flatten(1)))


class OfficialConvMap(TimeDistributed):
    """A convolution stack as the authors' Keras trainers build it: no projection, the map flattened channels-last
    (height, width, channel: Keras's order, so their ``Reshape`` of it cuts the same tokens) is the feature;
    Glorot-uniform kernels and zero biases, Keras's defaults."""

    pixel_scale: tuple[float, float]  # network input = pixels in [0, 1] * a + b

    def __init__(self, image_size: tuple[int, int], convs: nn.Sequential, name: str, minimum: str):
        super().__init__(image_size, 1)
        self.convs = convs
        for m in self.convs:
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.feature_dim = _flat_size(self.convs, self.image_size, name, minimum)

    def frame_features(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.pixel_scale
        return self.convs(x * a + b).permute(0, 2, 3, 1).flatten(1)


class CarRacingOfficial(OfficialConvMap):
    """Their CarRacing trainer's CNN: raw 0..255 pixels, conv 10@3x3/2, 20@5x5/2, 30@5x5/2, ReLU then dropout 0.2
    after each, flattened (2430 values at 96x96)."""

    pixel_scale = (255.0, 0.0)

    def __init__(self, image_size: tuple[int, int] = (96, 96), feature_dim: int = 0, dropout: float = 0.2):
        convs = nn.Sequential(
            nn.Conv2d(3, 10, 3, stride=2), nn.ReLU(), nn.Dropout(0.2),
            nn.Conv2d(10, 20, 5, stride=2), nn.ReLU(), nn.Dropout(0.2),
            nn.Conv2d(20, 30, 5, stride=2), nn.ReLU(), nn.Dropout(0.2),
        )
        super().__init__(image_size, convs, "carracing-official", "27x27")


class PilotNetOfficial(OfficialConvMap):
    """Their Udacity trainer's NVIDIA stack: pixels / 127.5 - 1, conv 24@5x5/2, 36@5x5/2, 48@5x5/2, 64@3x3, 64@3x3,
    ELU after each, no dropout, flattened (1x18x64 = 1152 values at 66x200)."""

    pixel_scale = (2.0, -1.0)

    def __init__(self, image_size: tuple[int, int] = (66, 200), feature_dim: int = 0, dropout: float = 0.0):
        convs = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),
            nn.Conv2d(48, 64, 3), nn.ELU(),
            nn.Conv2d(64, 64, 3), nn.ELU(),
        )
        super().__init__(image_size, convs, "pilotnet-official", "61x61")


ENCODERS: dict[str, Callable[..., TimeDistributed]] = {
    "carracing": CarRacingCNN, "pilotnet": PilotNet,
    "carracing-official": CarRacingOfficial, "pilotnet-official": PilotNetOfficial,
}
OFFICIAL_ENCODERS = ("carracing-official", "pilotnet-official")  # their feature is the conv map: no feature_dim


def build_encoder(name: str, image_size: tuple[int, int], feature_dim: int, dropout: float = 0.2) -> TimeDistributed:
    """Encoder by name; ValueError naming the valid names for an unknown one. The encoder's ``feature_dim`` is
    what it outputs per frame: ``feature_dim`` itself, or for the official encoders the size of their map."""
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; valid encoders: {', '.join(ENCODERS)}")
    if feature_dim < 1 and name not in OFFICIAL_ENCODERS:
        raise ValueError(f"feature_dim must be >= 1, got {feature_dim}")
    return ENCODERS[name](image_size=tuple(image_size), feature_dim=feature_dim, dropout=dropout)


def encoder_features(name: str, image_size: tuple[int, int], feature_dim: int) -> int:
    """The features per frame encoder ``name`` outputs at ``image_size``: ``feature_dim``, or an official
    encoder's map size (ValueError for an image too small)."""
    return build_encoder(name, image_size, feature_dim).feature_dim if name in OFFICIAL_ENCODERS else feature_dim
