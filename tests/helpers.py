"""Small builders shared by several test modules."""
from pathlib import Path

import torch

from policies.config import PolicyConfig
from policies.checkpoint import save_checkpoint
from policies.policy import DrivingPolicy

DRIVE_STEPS = 120  # steps of the recorded udacity drive (conftest.py's udacity_drive fixture)


def constant_policy_checkpoint(path: Path, action=(0.3, 0.2, 0.0), action_space: str = "continuous",
                               discrete_actions: str = "argmax", action_temperature: float = 1.0) -> Path:
    """A checkpoint whose policy outputs the same action on every frame (zero head weights, bias = the action).

    Discrete: zero weights and bias, i.e. uniform logits. Lets a test know exactly what the policy executes."""
    torch.manual_seed(0)
    head = "discrete" if action_space == "discrete" else "continuous"
    policy = DrivingPolicy(PolicyConfig.for_actions(head, core="lstm", core_options={"hidden": 8}, window=3,
                                                    frame_stride=1, feature_dim=8, action_space=action_space,
                                                    discrete_actions=discrete_actions,
                                                    action_temperature=action_temperature))
    with torch.no_grad():
        policy.head.weight.zero_()
        if head == "continuous":
            policy.head.bias.copy_(torch.tensor(action, dtype=torch.float32))
    return save_checkpoint(path, policy)


def steering_checkpoint(path: Path, steer: float = 0.1, frame_shape: list[int] | None = None) -> Path:
    """A udacity steering student (PilotNet + a small GRU) that answers ``steer`` on every frame; ``frame_shape``:
    the camera frames it says it was trained on (None: says nothing, its env's)."""
    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig.for_actions("continuous", ["steer"], encoder="pilotnet", core="gru",
                                                    core_options={"hidden": 8}, window=3, frame_stride=1, feature_dim=8,
                                                    image_size=[66, 200], crop=[60, 135], env="UdacityStyle-v0",
                                                    target_mean=[0.02], target_std=[0.1], frame_shape=frame_shape))
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.fill_((steer - 0.02) / 0.1)  # the head regresses the normalised target
    return save_checkpoint(path, policy)


def record_told_latency(monkeypatch) -> list:
    """Patch PolicyStream.step to record the latency each step tells the policy (seconds; None: not told)."""
    from policies.policy import PolicyStream

    told: list = []
    step = PolicyStream.step

    def recording_step(self, frame, t=None, latency=None, on_the_way=None):
        told.append(latency)
        return step(self, frame, t, latency, on_the_way)

    monkeypatch.setattr(PolicyStream, "step", recording_step)
    return told


def full_disk(monkeypatch, name_part: str, after: int = 0) -> None:
    """The disk fills up for files whose name holds ``name_part``: their fsync (where a full disk shows at the
    latest in common.files' atomic writes) raises ENOSPC from the ``after``+1-th such file on."""
    import errno
    import os

    real = os.fsync
    seen = [0]

    def fsync(fd):
        if name_part in Path(os.readlink(f"/proc/self/fd/{fd}")).name:
            seen[0] += 1
            if seen[0] > after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
