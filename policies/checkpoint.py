"""Driving-policy checkpoints: write one (``save_checkpoint``, ``checkpoint_writer``), read and check one
(``read_checkpoint``: ``weights_only`` only, clear errors for every file that is not one), rebuild its policy
(``policy_from_checkpoint``, ``load_checkpoint``).

Its own module because checkpoint I/O is a job of its own: the file format (``CHECKPOINT_FORMAT``, its version), the
diagnosis of wrong files, and atomic writes. A checkpoint holds the config (``policies.config.PolicyConfig``) beside
the weights, so the file alone rebuilds its policy.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.files import atomic_write
from policies.config import PolicyConfig
from policies.policy import DrivingPolicy

CHECKPOINT_FORMAT = "nac-drive/driving-policy"
CHECKPOINT_VERSION = 1
# the student shipped for people's recordings of the real simulator (evaluate.py --data / --replay REC, the bridge):
# trained on many drivers' public recordings, it steers drivers it never saw better than the simulator-trained one
RECORDING_STUDENT = Path("checkpoints/udacity_real_nac.pt")


def save_checkpoint(path: str | Path, policy: DrivingPolicy, **extra: Any) -> Path:
    """Atomically write weights + config (+ ``extra``: metadata, optimizer state, ...) to ``path``.

    Everything is tensors and plain Python data, so the file loads with ``torch.load(weights_only=True)``.
    """
    path = Path(path)
    atomic_write(path, checkpoint_writer(policy, **extra))  # a reader never sees half a checkpoint
    return path


def checkpoint_writer(policy: DrivingPolicy, **extra: Any) -> Callable[[Any], Any]:
    """What ``save_checkpoint`` writes, as a function of the open file: several checkpoints that belong together
    are written at once (common.files.atomic_write_all)."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": policy.config.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in policy.state_dict().items()},
        **extra,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return lambda f: f.write(buffer.getbuffer())


_EXPECTED = "expected a .pt file written by train.py (a run folder's best.pt or last.pt)"


def _what_the_file_is(path: Path, error: Exception) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in the user's words: one sentence that says what
    the file is not, what was expected and what to do (never torch's own advice to load it unsafely)."""
    import pickle
    import zipfile

    unreadable = "is not a readable driving-policy checkpoint (corrupted, truncated or another binary format)"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = set(z.namelist())
        except (zipfile.BadZipFile, OSError):
            names = set()
        if "policy.pth" in names and ("data" in names or "_stable_baselines3_version" in names):
            return (f"{str(path)!r} is a PPO expert (a stable-baselines3 .zip), not a driving-policy checkpoint; "
                    f"evaluate it with python evaluate.py --expert-drives --expert {path}")
        if not any(n.endswith("data.pkl") for n in names):
            return f"{str(path)!r} is a .zip archive, not a driving-policy checkpoint; {_EXPECTED}"
        if isinstance(error, pickle.UnpicklingError):  # a torch.save of arbitrary Python objects
            return (f"{str(path)!r} is a PyTorch file that holds Python objects besides tensors and plain data, so "
                    f"it is not a driving-policy checkpoint and is not loaded; {_EXPECTED}")
        return f"{str(path)!r} {unreadable}; {_EXPECTED}"
    with open(path, "rb") as f:
        head = f.read(4096)
    try:
        head.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError as e:
        utf8 = e.start >= len(head) - 3  # only a character cut at the 4096-byte boundary
    text = utf8 and not any(c < 32 and c not in b"\t\n\f\r" for c in head)
    beside = path.with_suffix(".pt")
    todo = f"did you mean {beside}?" if path.suffix != ".pt" and beside.is_file() else _EXPECTED
    if not head:
        return f"{str(path)!r} is empty, not a driving-policy checkpoint; {todo}"
    if text:
        return f"{str(path)!r} is a text file, not a driving-policy checkpoint; {todo}"
    return f"{str(path)!r} {unreadable}; {todo}"


def not_a_checkpoint_file(path: Path, what: str) -> str:
    """Why ``path`` cannot be read as a checkpoint: missing, or a folder (a run folder given instead of its best.pt)."""
    if not path.is_dir():
        return f"{what} {str(path)!r} does not exist"
    found = sorted(p.name for p in path.glob("*.pt"))
    pick = "best.pt" if "best.pt" in found else (found[0] if found else None)
    hint = f": pass a file in it, e.g. {str(path / pick)!r}" if pick else " (and holds no .pt file)"
    return f"{what} {str(path)!r} is a folder, not a checkpoint file{hint}"


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint's dict, checked to be a policy checkpoint (clear errors otherwise).

    Loads with ``weights_only=True`` only: a file that needs arbitrary Python objects is refused, never unpickled."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(not_a_checkpoint_file(path, "checkpoint"))
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise ValueError(_what_the_file_is(path, e)) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is a PyTorch file but not a driving-policy checkpoint (it has no "
                         f"format {CHECKPOINT_FORMAT!r}); {_EXPECTED}")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{str(path)!r} is a driving-policy checkpoint of version "
                         f"{payload.get('version')!r}, but this "
                         f"code reads version {CHECKPOINT_VERSION}; train it again with this train.py")
    if not isinstance(payload.get("config"), dict) or not isinstance(payload.get("state_dict"), dict):
        raise ValueError(f"{str(path)!r} is an incomplete driving-policy checkpoint (no config or no state_dict); "
                         f"save it again with train.py")
    return payload


def policy_from_checkpoint(payload: dict[str, Any], where: str = "checkpoint") -> DrivingPolicy:
    try:
        policy = DrivingPolicy(PolicyConfig.from_dict(payload["config"]))
        policy.load_state_dict(payload["state_dict"])
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"{where}: cannot rebuild the policy ({str(e).splitlines()[0][:300]})") from None
    return policy


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> DrivingPolicy:
    """Rebuild a policy from its checkpoint file alone (in eval mode)."""
    payload = read_checkpoint(path, map_location)
    return policy_from_checkpoint(payload, f"checkpoint {str(path)!r}").to(map_location).eval()
