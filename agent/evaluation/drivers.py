"""Who drives an evaluation: the checkpoints loaded as controllers (checked against the env's actions and the
action options), or the expert; each with what its metrics.json records about it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.controllers import PolicyController, load_policy
from agent.evaluation.config import Conditions, Drivers
from envs.registry import get_spec
from policies.actions import DISCRETE_ACTIONS, check_discrete_options


@dataclass
class Driver:
    """One policy (or the expert) that drives: its display name, its controller and what its metrics.json records
    about it (``meta["source"]``: the checkpoint it was loaded from)."""

    name: str
    controller: Any
    meta: dict[str, Any]


def env_action_names(env: str, pi_speed: bool) -> list[str] | None:
    """The components of the env's action a student fills: [steer] under a PI speed controller and in a replay
    (which drives at the recorded speed); None: the student's own env's action."""
    if pi_speed:
        return ["steer"]
    spec = get_spec(env)
    return list(spec.action_names["continuous"]) if spec.feeds else None


def policy_drivers(d: Drivers, c: Conditions, env: str, device: str) -> tuple[list[Driver], str]:
    """The checkpoints that drive, and their common action space."""
    if d.expert_drives:
        return [], d.action_space or get_spec(env).action_spaces[0]
    paths = list(d.checkpoints)
    policies = [load_policy(p, env, d.action_space, device) for p in paths]
    spaces = {p.config.action_space for p in policies}
    if len(spaces) > 1:
        raise ValueError(f"--checkpoint files mix action spaces {sorted(spaces)}; compare one action space "
                         f"at a time (the expert that shadows them differs)")
    for path, policy in zip(paths, policies):
        check_actions(d, env, path, policy.config)
    drivers = []
    for path, name, policy in zip(paths, d.names_of(paths), policies):
        controller = PolicyController(policy, name, device, c.window_clock, env_action_names(env, d.pi_speed),
                                      d.discrete_actions, d.action_temperature, d.spared, c.told_latency_s)
        drivers.append(Driver(name, controller, {
            "source": str(path), "policy_config": policy.config.to_dict(),
            "num_parameters": int(sum(p.numel() for p in policy.parameters())),
            "filled_from_expert": controller.filled, "window_clock": c.window_clock,
            **({"latency_input": policy.config.latency_input, "told_latency_s": c.told_latency_s}
               if policy.config.latency_input != "none" else {}),
            **({"discrete_actions": controller.actions, "action_temperature": controller.temperature,
                **({"temperature_spares": [DISCRETE_ACTIONS[i] for i in d.spared]} if d.spared else {})}
               if policy.config.head == "discrete" else {}),
        }))
    return drivers, spaces.pop()


def check_actions(d: Drivers, env: str, path: str, cfg: Any) -> None:
    """A continuous checkpoint must predict the actions the env takes: [steer] with --pi-speed, else the spec's;
    --discrete-actions sample needs a discrete one."""
    check_action_options(d, path, cfg)
    spec = get_spec(env)
    if cfg.head != "continuous" or not spec.pi_speed:
        return
    names, wanted = tuple(cfg.action_names), ("steer",) if d.pi_speed else tuple(spec.action_names[cfg.action_space])
    if names == wanted or (cfg.fixed_throttle is not None and names + ("throttle",) == wanted):
        return  # a steering policy with a fixed throttle drives [steer, throttle] (PolicyConfig.fixed_throttle)
    if names == ("steer",):
        raise ValueError(f"checkpoint {path!r} predicts steering only, but {env} is driven with {list(wanted)}; "
                         "pass --pi-speed to let the env's PI controller hold the speed")
    raise ValueError(f"checkpoint {path!r} predicts {list(names)}, but {env} "
                     f"{'with --pi-speed ' if d.pi_speed else ''}is driven with {list(wanted)}")


def check_action_options(d: Drivers, path: str, cfg: Any) -> None:
    """--discrete-actions other than argmax, --action-temperature and --temperature-spares need a discrete student,
    and the last two a rule that samples (policies.actions.check_discrete_options, named by the flags)."""
    check_discrete_options(cfg.head, cfg.discrete_actions, d.discrete_actions, d.action_temperature, d.spares_given,
                           f"checkpoint {path!r}",
                           ("--discrete-actions", "--action-temperature", "--temperature-spares"))


def expert_meta(expert: Any) -> dict[str, Any]:
    """The expert's file and the headline of its own card (the baseline row of comparison.md)."""
    card = expert.card.get("evaluation") or {}
    meta = {"source": str(expert.path), "expert_card_evaluation": {
        k: card[k] for k in ("mean_return", "std_return", "laps_finished", "episodes") if k in card}}
    if card.get("seeds"):
        meta["expert_card_evaluation"]["seeds"] = f"{min(card['seeds'])}..{max(card['seeds'])}"
    return meta
