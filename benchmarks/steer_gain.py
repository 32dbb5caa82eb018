"""Does a student that steers too little in curves drive better with its steering scaled up?

Writes one copy of a checkpoint per gain, the same weights with ``steer_gain`` set in its config (the policy
multiplies its continuous steering by it before the clip, in every closed loop and in offline scores), named
``OUT/<stem>_g<gain>.pt``; score them beside the original with ``benchmarks.heldout_drivers``. Motivated by the
jungle: in the second before the replay took over, the pooled student steered 0.77-0.97x what its driver did.

    python -m benchmarks.steer_gain --checkpoint checkpoints/udacity_real_nac.pt --gain 1.15 1.3 --out runs/gain
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.cli import option, run_command

PROG = "python -m benchmarks.steer_gain"


@dataclass
class SteerGainArgs:
    checkpoint: str = option(None, "the student whose steering is scaled", group="model", required=True)
    gain: list[float] = option([], "steering gains, one checkpoint each (in (0, 4]; 1 changes nothing)",
                               group="model", required=True)
    out: Path = option(Path("runs/gain"), "folder of the scaled checkpoints", group="output")


def with_gain(checkpoint: str | Path, gain: float, out: Path) -> Path:
    """A copy of ``checkpoint`` whose config has ``steer_gain`` = ``gain`` (refused by the config when no gain can
    apply: a discrete head, no steering, a gain outside (0, 4]); its metadata is kept."""
    from policies.config import PolicyConfig
    from policies.checkpoint import policy_from_checkpoint, read_checkpoint, save_checkpoint

    payload = read_checkpoint(checkpoint, "cpu")
    policy = policy_from_checkpoint(payload, f"checkpoint {str(checkpoint)!r}")
    try:
        policy.config = PolicyConfig.from_dict({**payload["config"], "steer_gain": float(gain)})
    except ValueError as e:
        raise ValueError(f"--gain {gain:g} for {checkpoint}: {e}") from None
    extra = {k: v for k, v in payload.items() if k not in ("format", "version", "config", "state_dict")}
    return save_checkpoint(out / f"{Path(checkpoint).stem}_g{gain:g}.pt", policy, **extra)


def main(argv: list[str] | None = None) -> int:
    return run_command(SteerGainArgs, _benchmark, argv, prog=PROG, doc=__doc__, mistakes=(ValueError, OSError))


def _benchmark(a: SteerGainArgs) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    paths = [with_gain(a.checkpoint, g, a.out) for g in a.gain]
    for p in paths:
        print(f"wrote {p}")
    names = " ".join(f"g{g:g}" for g in a.gain)
    print(f"score them: python -m benchmarks.heldout_drivers --recordings data/heldout --checkpoint {a.checkpoint} "
          f"{' '.join(map(str, paths))} --name base {names} --out eval/steer_gain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
