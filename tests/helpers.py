"""Small builders shared by several test modules."""
from pathlib import Path

import torch

from policies.policy import DrivingPolicy, PolicyConfig, save_checkpoint


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


def steering_checkpoint(path: Path, steer: float = 0.1) -> Path:
    """A udacity steering student (PilotNet + a small GRU) that answers ``steer`` on every frame."""
    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig.for_actions("continuous", ["steer"], encoder="pilotnet", core="gru",
                                                    core_options={"hidden": 8}, window=3, frame_stride=1, feature_dim=8,
                                                    image_size=[66, 200], crop=[60, 135], env="UdacityStyle-v0",
                                                    target_mean=[0.02], target_std=[0.1]))
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
