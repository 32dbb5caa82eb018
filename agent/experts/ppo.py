"""Training the privileged PPO expert of every env (a warm start by behaviour cloning, then PPO), and its CLI.

The expert is an SB3 PPO MlpPolicy that reads `info["privileged"]` (the env spec's `feature_names`), not
pixels, so it trains in the physics-only env at thousands of steps/s and acts every frame. Its labels
are what the student imitates from the frames. What differs between envs (the privileged features, PPO's
action space and its mapping to the env's, the training env's reward shaping, the scripted teacher of the
warm start, the shipped files) comes from the env's `envs.spec.EnvSpec`; this module holds no env names.

    python -m agent.experts.ppo train --env carracing --action-space continuous --timesteps 1500000 \\
        --out checkpoints/expert_carracing_continuous.zip
    python -m agent.experts.ppo train --env udacity --timesteps 200000 --bc-episodes 40 --log-std-init -1.6 \\
        --out checkpoints/expert_udacity.zip
    python -m agent.experts.ppo evaluate --expert checkpoints/expert_carracing_continuous.zip --episodes 20 --seed 1000

Design choices (why):
* Warm start: behaviour-clone the env's scripted privileged teacher on perturbed training tracks (actor and
  critic), then fine-tune with PPO; PPO from scratch spends most of its budget learning to stay on the road.
* Tracks: training draws seeds from the spec's [train_low, train_high) (all >= 100000), so no seed below
  100000 was ever trained on; checkpoint selection uses the spec's validation seeds, the card reports its
  card seeds (1000..1019). Evaluation always uses the true env reward.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from agent.experts.expert import EvalResult, Expert, evaluate_model, space_of
from agent.experts.latency import LatencyQueue, widen_policy
from common.cli import option, run_command
from common.files import file_sha256, resolve_path, write_json
from envs.registry import ENV_NAMES, EnvSpec, get_spec

PROG = "python -m agent.experts.ppo"


class RandomTrack(gym.Wrapper):
    """Resets onto a fresh track whose seed is drawn from the training range (never a test seed)."""

    def __init__(self, env: gym.Env, seed: int, low: int, high: int) -> None:
        super().__init__(env)
        self._rng = np.random.default_rng(seed)
        self._low, self._high = low, high

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        track_seed = int(self._rng.integers(self._low, self._high)) if seed is None else seed
        return self.env.reset(seed=track_seed, options=options)


def make_train_env(spec: EnvSpec, action_space: str, seed: int, latency: tuple[int, int] | None = None) -> gym.Env:
    """The env's shaped training env on random training tracks (seeds from spec.seeds); with ``latency`` (lo, hi)
    every episode is driven under a latency drawn from lo..hi steps, shown to the expert (agent.experts.latency)."""
    env = spec.make_train_env(action_space)
    if latency is not None:
        env = LatencyQueue(env, latency, seed)
    return RandomTrack(env, seed, spec.seeds.train_low, spec.seeds.train_high)


def parse_latency_range(text: str | None) -> tuple[int, int] | None:
    """``--latency-steps 0:10`` -> (0, 10); ``5`` -> (5, 5); None stays None."""
    if text is None:
        return None
    try:
        lo, _, hi = text.partition(":")
        lo_hi = (int(lo), int(hi or lo))
    except ValueError:
        lo_hi = (-1, -1)
    if not 0 <= lo_hi[0] <= lo_hi[1] <= 100 or lo_hi[1] == 0:
        raise ValueError(f"--latency-steps must be D or A:B steps with 0 <= A <= B <= 100 and B > 0, got {text!r}")
    return lo_hi


def collect_teacher_data(
    spec: EnvSpec, action_space: str, episodes: int, seed: int, gamma: float, driver: Any
) -> dict[str, np.ndarray]:
    """Drive the teacher on training tracks with perturbations (so off-centre recoveries are seen);
    label every visited state with the teacher's action and the discounted shaped return."""
    rng = np.random.default_rng(seed)
    obs_l, act_l, ret_l = [], [], []
    for ep in range(episodes):
        env = make_train_env(spec, action_space, seed * 7919 + ep)
        obs, _ = env.reset()
        noise_level = rng.uniform(0.0, 0.6)  # per episode: from clean laps to heavy perturbation
        rewards, perturb, push = [], 0, None
        done = False
        while not done:
            label = driver.ppo_action(obs, action_space)
            obs_l.append(obs)
            act_l.append(label)
            if perturb == 0 and rng.random() < 0.02 * noise_level:
                perturb = int(rng.integers(5, 25))
                push = env.action_space.sample() if action_space == "discrete" else \
                    rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
            if perturb > 0:
                perturb -= 1
                executed = push
            else:
                executed = label
            obs, r, term, trunc, _ = env.step(executed)
            rewards.append(r)
            done = term or trunc
        ret, out = 0.0, []
        for r in reversed(rewards):
            ret = r + gamma * ret
            out.append(ret)
        ret_l.extend(reversed(out))
        env.close()
    dtype = np.int64 if action_space == "discrete" else np.float32
    return {"obs": np.asarray(obs_l, np.float32), "action": np.asarray(act_l, dtype),
            "return": np.asarray(ret_l, np.float32)}


def behaviour_clone(model: Any, data: dict[str, np.ndarray], *, epochs: int, seed: int, log: Any = print) -> None:
    """Fit PPO's actor to the teacher labels (MSE on the Gaussian mean / cross-entropy on logits) and its
    critic to the teacher's returns, so PPO fine-tuning starts from a driving policy with sane advantages."""
    import torch
    import torch.nn.functional as Fn

    policy = model.policy
    gen = torch.Generator().manual_seed(seed)
    obs = torch.as_tensor(data["obs"])
    act = torch.as_tensor(data["action"])
    ret = torch.as_tensor(data["return"])
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    n = len(obs)
    policy.train()
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        tot_a = tot_v = 0.0
        for start in range(0, n, 256):
            idx = perm[start : start + 256]
            features = policy.extract_features(obs[idx])
            latent_pi, latent_vf = policy.mlp_extractor(features)
            out = policy.action_net(latent_pi)
            if isinstance(model.action_space, gym.spaces.Discrete):
                loss_a = Fn.cross_entropy(out, act[idx])
            else:
                loss_a = Fn.mse_loss(out, act[idx])
            loss_v = Fn.mse_loss(policy.value_net(latent_vf).squeeze(-1), ret[idx])
            loss = loss_a + 0.01 * loss_v
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot_a += loss_a.item() * len(idx)
            tot_v += loss_v.item() * len(idx)
        if epoch % 5 == 0 or epoch == epochs - 1:
            log(f"BC epoch {epoch:>3d}: action loss {tot_a / n:.4f}, value loss {tot_v / n:.1f}")
    policy.set_training_mode(False)


@dataclass
class PPOTrainArgs:
    out: Path = option(help="output .zip; the card is written beside it as .json", group="output", required=True)
    action_space: str | None = option(None, "env action space the expert drives (default: the env's first)",
                                      group="model")
    env: str = option("carracing", "environment", group="data", choices=ENV_NAMES)
    timesteps: int = option(1_500_000, "total env steps", group="optimisation")
    seed: int = option(0, "training seed: PPO's weights and sampling and its draws of training tracks (not a track "
                       "seed: the card's tracks are 1000..)", group="optimisation")
    n_envs: int = option(8, "envs PPO steps together", group="optimisation")
    subprocesses: bool = option(False, "step each env in its own process (SB3's SubprocVecEnv; faster where cores "
                                "are spare, the same numbers otherwise)", group="optimisation")
    eval_every: int = option(50_000, "env steps between validations", group="evaluation conditions")
    eval_episodes: int = option(20, "validation tracks (the env's validation seeds) per validation",
                                group="evaluation conditions")
    card_episodes: int = option(20, "unseen tracks for the card (seeds 1000..)", group="evaluation conditions")
    max_steps: int | None = option(None, "steps of a validation/card episode (default: the env's own limit)",
                                   group="evaluation conditions", former=("--max-episode-steps",))
    learning_rate: float = option(3e-4, "PPO learning rate", group="optimisation")
    n_steps: int = option(512, "rollout length per env", group="optimisation")
    batch_size: int = option(512, "PPO minibatch size", group="optimisation")
    ent_coef: float = option(0.0, "PPO entropy coefficient", group="optimisation")
    init: Path | None = option(None, "warm-start from this expert .zip (fine-tune)", group="model")
    bc_episodes: int = option(0, "behaviour-clone the env's scripted privileged driver on this many training tracks "
                              "before PPO (0 = off)", group="optimisation")
    bc_epochs: int = option(30, "epochs of that warm start", group="optimisation")
    log_std_init: float = option(-0.5, "continuous: initial log std of the policy (about -1.6 when fine-tuning a "
                                 "cloned policy)", group="model")
    target_kl: float | None = option(None, "PPO per-update KL early stop (protects a warm-started policy)",
                                     group="optimisation")
    logdir: Path = option(Path("runs/expert"), "TensorBoard root", group="output")
    latency_steps: str | None = option(
        None, "train an expert that drives under latency: each episode's actions land D steps after they are "
        "chosen, D drawn per episode from A:B (or fixed D); the expert sees D and the actions on their way "
        "(continuous only; with --init the regular expert's weights start it, the new inputs at 0)", group="model")


def check_args(a: PPOTrainArgs) -> None:
    """Validate at the boundary: every flag's value, before any env is made."""
    spec = get_spec(a.env)
    space = spec.check_action_space(a.action_space or spec.action_spaces[0])
    for name in ("timesteps", "n_envs", "eval_every", "eval_episodes", "card_episodes", "n_steps", "batch_size"):
        if getattr(a, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.eval_episodes > len(spec.seeds.validation):
        raise ValueError(f"--eval-episodes must be <= {len(spec.seeds.validation)}, got {a.eval_episodes}")
    if a.card_episodes > len(spec.seeds.card):
        raise ValueError(f"--card-episodes must be <= {len(spec.seeds.card)}, got {a.card_episodes}")
    if a.out.suffix != ".zip":
        raise ValueError(f"--out must end in .zip (an SB3 model file), got {str(a.out)!r}")
    if a.bc_episodes < 0 or a.bc_epochs <= 0:
        raise ValueError(f"--bc-episodes must be >= 0 and --bc-epochs > 0, got {a.bc_episodes}, {a.bc_epochs}")
    if a.init is not None and a.bc_episodes:
        raise ValueError("--init and --bc-episodes are exclusive (both choose the starting policy)")
    if a.init is not None and not resolve_path(a.init).is_file():
        raise FileNotFoundError(f"--init expert file not found: {str(a.init)!r}")
    if parse_latency_range(a.latency_steps) is not None and space != "continuous":
        raise ValueError("--latency-steps needs --action-space continuous (the expert sees its queued actions)")


@dataclass(frozen=True)
class PPOSettings:
    """What SB3's PPO is built with (a fresh model, or the --init one loaded to fine-tune)."""

    learning_rate: float
    n_steps: int
    batch_size: int
    ent_coef: float
    target_kl: float | None
    log_std_init: float  # continuous policies only
    seed: int
    logdir: Path  # TensorBoard root


@dataclass(frozen=True)
class Validation:
    """How checkpoints are selected and the card scored: every ``every`` env steps, deterministic episodes on the
    env's first ``episodes`` validation seeds; the card on its first ``card_episodes`` card seeds."""

    every: int
    episodes: int
    card_episodes: int
    max_steps: int | None  # None: the env's own limit
    latency: tuple[int, int] | None  # --latency-steps A:B

    def latencies(self) -> list[int] | None:
        """One latency per validation track, lo..hi in turn (every latency of the range is selected for)."""
        if self.latency is None:
            return None
        lo, hi = self.latency
        return [lo + k % (hi - lo + 1) for k in range(self.episodes)]


@dataclass(frozen=True)
class PPOPlan:
    """A training run's arguments once resolved (resolve): the env and action space, the starting policy, the
    PPO settings, the selection; ``record``: the arguments the card keeps as its hyperparameters."""

    out: Path
    spec: EnvSpec
    action_space: str
    timesteps: int
    seed: int
    n_envs: int
    subprocesses: bool
    init: Path | None
    bc_episodes: int
    bc_epochs: int
    latency: tuple[int, int] | None
    ppo: PPOSettings
    validation: Validation
    record: dict[str, Any]


def resolve(a: PPOTrainArgs) -> PPOPlan:
    """The boundary: the arguments checked (check_args), the action space defaulted to the env's first, and cut
    into the plan train reads."""
    check_args(a)
    spec = get_spec(a.env)
    space = spec.check_action_space(a.action_space or spec.action_spaces[0])
    latency = parse_latency_range(a.latency_steps)
    return PPOPlan(a.out, spec, space, a.timesteps, a.seed, a.n_envs, a.subprocesses, a.init, a.bc_episodes,
                   a.bc_epochs, latency,
                   PPOSettings(a.learning_rate, a.n_steps, a.batch_size, a.ent_coef, a.target_kl, a.log_std_init,
                               a.seed, a.logdir),
                   Validation(a.eval_every, a.eval_episodes, a.card_episodes, a.max_steps, latency),
                   asdict(replace(a, action_space=space)))


def _atomic_save(model: Any, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.zip")
    model.save(tmp)
    os.replace(tmp, path)


def _make_best_callback(v: Validation, spec: EnvSpec, action_space: str, warm_start: bool, best_path: Path,
                        log: Any):
    from stable_baselines3.common.callbacks import BaseCallback

    class BestByMultiSeedEval(BaseCallback):
        """Every `eval_every` env steps: deterministic episodes on the validation seeds (true reward);
        keep the checkpoint with the best mean return (ties broken by laps finished)."""

        def __init__(self) -> None:
            super().__init__()
            self.best: tuple[float, float] = (-math.inf, -math.inf)
            self.best_step = 0
            self.best_result: EvalResult | None = None
            self.history: list[dict[str, Any]] = []
            self._next = v.every

        def _on_training_start(self) -> None:
            if warm_start:  # the warm start itself is a candidate
                self.evaluate()

        def _on_step(self) -> bool:
            if self.num_timesteps >= self._next:
                self._next += v.every
                self.evaluate()
            return True

        def evaluate(self) -> None:
            res = evaluate_model(self.model, spec, action_space, spec.seeds.validation[: v.episodes],
                                 max_episode_steps=v.max_steps, latencies=v.latencies(),
                                 max_latency=(v.latency or (0, 0))[1])
            self.logger.record("eval/mean_return", res.mean)
            self.logger.record("eval/std_return", res.std)
            self.logger.record("eval/laps_finished", sum(res.laps) / len(res.laps))
            self.history.append({"timesteps": self.num_timesteps, "mean": res.mean, "std": res.std,
                                 "laps": sum(res.laps)})
            score = (res.mean, float(sum(res.laps)))
            tag = ""
            if score > self.best:
                self.best, self.best_step, self.best_result = score, self.num_timesteps, res
                _atomic_save(self.model, best_path)
                tag = "  <- best"
            log(f"[{self.num_timesteps:>8d}] validation {res.summary()}{tag}")

        def _on_training_end(self) -> None:
            if (self.num_timesteps > self.best_step and self.history
                    and self.history[-1]["timesteps"] != self.num_timesteps):
                self.evaluate()

    return BestByMultiSeedEval()


def train(plan: PPOPlan, *, command: str | None = None, log: Any = print) -> Path:
    """Train a PPO expert as ``plan`` (resolve) says, keep the best checkpoint by multi-seed validation, write .zip +
    JSON card."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    torch.set_num_threads(1)
    t0 = time.time()
    out, spec, space, v = plan.out, plan.spec, plan.action_space, plan.validation
    seed, latency = plan.seed, plan.latency
    out.parent.mkdir(parents=True, exist_ok=True)
    run_name = f"{spec.name}_{space}_seed{seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    vec_env = SubprocVecEnv if plan.subprocesses else DummyVecEnv
    venv = VecMonitor(vec_env([(lambda i=i: make_train_env(spec, space, seed * 1000 + i, latency))
                               for i in range(plan.n_envs)]))
    model, init_card = _initial_model(plan, venv)
    teacher = spec.teacher()
    if plan.bc_episodes:
        tb = time.time()
        data = collect_teacher_data(spec, space, plan.bc_episodes, plan.seed, model.gamma, teacher)
        log(f"teacher data: {len(data['obs'])} states from {plan.bc_episodes} training tracks "
            f"({time.time() - tb:.0f} s)")
        behaviour_clone(model, data, epochs=plan.bc_epochs, seed=plan.seed, log=log)
    best_path = out.with_name(out.stem + ".best.tmp.zip")
    callback = _make_best_callback(v, spec, space, bool(plan.bc_episodes) or plan.init is not None, best_path, log)
    model.learn(total_timesteps=plan.timesteps, callback=callback, tb_log_name=run_name, progress_bar=False)
    if callback.best_result is None:  # shorter than one validation period
        callback.evaluate()
    best = PPO.load(best_path, device="cpu")
    card_latencies = None if plan.latency is None else [plan.latency[1]] * v.card_episodes
    res = evaluate_model(best, spec, space, spec.seeds.card[: v.card_episodes],
                         max_episode_steps=v.max_steps, latencies=card_latencies,
                         max_latency=(plan.latency or (0, 0))[1])
    log(f"card evaluation (unseen seeds): {res.summary()}")
    os.replace(best_path, out)
    card = _expert_card(plan, venv, model, teacher, callback, res, init_card)
    card.update(wall_time_s=round(time.time() - t0, 1), command=command or "",
                tensorboard=str(plan.ppo.logdir / f"{run_name}_1"))
    write_json(out.with_suffix(".json"), card)
    venv.close()
    log(f"saved {out} and {out.with_suffix('.json')} ({card['wall_time_s']:.0f} s)")
    return out


def _initial_model(plan: PPOPlan, venv: Any) -> tuple[Any, dict[str, Any] | None]:
    """A fresh PPO model, or (--init) a trained one to fine-tune, with that one's card."""
    from stable_baselines3 import PPO

    p = plan.ppo
    if plan.init is not None:
        init_json = resolve_path(plan.init).with_suffix(".json")
        init_card = json.loads(init_json.read_text()) if init_json.is_file() else None
        source = PPO.load(resolve_path(plan.init), device="cpu")
        if space_of(source) != plan.action_space:
            raise ValueError(f"--init {str(plan.init)!r} is not a {plan.action_space!r} expert")
        if source.observation_space.shape != venv.observation_space.shape:  # a regular expert -> a latency expert
            model = _fresh_model(p, plan.action_space, venv)
            widen_policy(source, model)
            return model, init_card
        model = PPO.load(resolve_path(plan.init), env=venv, device="cpu", learning_rate=p.learning_rate,
                         n_steps=p.n_steps, batch_size=p.batch_size, ent_coef=p.ent_coef,
                         target_kl=p.target_kl, tensorboard_log=str(p.logdir), seed=p.seed)
        return model, init_card
    return _fresh_model(p, plan.action_space, venv), None


def _fresh_model(p: PPOSettings, action_space: str, venv: Any) -> Any:
    from stable_baselines3 import PPO

    return PPO(
        "MlpPolicy",
        venv,
        learning_rate=p.learning_rate,
        n_steps=p.n_steps,
        batch_size=p.batch_size,
        n_epochs=10,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=p.ent_coef,
        max_grad_norm=0.5,
        target_kl=p.target_kl,
        policy_kwargs=dict(net_arch=dict(pi=[128, 128], vf=[128, 128]),
                           **({"log_std_init": p.log_std_init} if action_space == "continuous" else {})),
        tensorboard_log=str(p.logdir),
        seed=p.seed,
        device="cpu",
        verbose=0,
    )


def _shaping_of(spec: EnvSpec, action_space: str) -> Any:
    """The training env's reward shaping, if it has one (a dataclass on a wrapper)."""
    probe = spec.make_train_env(action_space)
    try:
        shaping = probe.get_wrapper_attr("shaping")
        return asdict(shaping) if hasattr(shaping, "__dataclass_fields__") else str(shaping)
    except AttributeError:
        return None
    finally:
        probe.close()


def _expert_card(plan: PPOPlan, venv: Any, model: Any, teacher: Any, callback: Any, res: EvalResult,
                 init_card: dict[str, Any] | None) -> dict[str, Any]:
    """The expert's JSON card: how it was made, how it was selected, how it scores on unseen tracks."""
    spec = plan.spec
    return {
        "env": f"{spec.gym_id} ({spec.name}); physics-only for training and evaluation",
        "env_name": spec.name,
        "action_space": plan.action_space,
        "policy_action": str(venv.action_space) + " -> env action by the env spec's expert_to_env_action ("
        + spec.expert_to_env_action.__doc__.strip().splitlines()[0] + ")",
        "algorithm": "stable-baselines3 PPO, MlpPolicy (pi/vf 128x128) on the privileged observation, "
        + (f"fine-tuned from {plan.init}" if plan.init else
           f"behaviour-cloned from the scripted driver {type(teacher).__module__}.{type(teacher).__name__} "
           f"({plan.bc_episodes} perturbed training tracks, {plan.bc_epochs} epochs) then PPO fine-tuned"
           if plan.bc_episodes else "PPO from scratch")
        + f"; shipped checkpoint = best validation at {callback.best_step} PPO timesteps"
        + (" (i.e. the behaviour-cloned policy before any PPO update)"
           if callback.best_step == 0 and plan.bc_episodes else ""),
        "teacher": asdict(teacher) if plan.bc_episodes and hasattr(teacher, "__dataclass_fields__") else None,
        "init_card": init_card,  # how the --init policy was obtained (its command reproduces it)
        "features": list(spec.feature_names),
        "timesteps": int(model.num_timesteps),
        "best_checkpoint_timesteps": int(callback.best_step),
        "train_seeds": f"track seeds drawn uniformly from [{spec.seeds.train_low}, {spec.seeds.train_high})",
        "selection": {"seeds": list(spec.seeds.validation[: plan.validation.episodes]), "mean_return": callback.best[0],
                      "history": callback.history},
        "evaluation": {"seeds": res.seeds, "mean_return": res.mean, "std_return": res.std,
                       "laps_finished": int(sum(res.laps)), "episodes": len(res.seeds),
                       "returns": [round(r, 2) for r in res.returns], "lengths": res.lengths,
                       "off_road_steps": res.off_road_steps,
                       "latency_steps": None if plan.latency is None else plan.latency[1],  # the hardest
                       "reward": "true env reward, deterministic policy"},
        "shaping": _shaping_of(spec, plan.action_space),
        "latency_steps": None if plan.latency is None else list(plan.latency),  # drawn per episode; shown to it
        # the expert it was fine-tuned from: a latency expert's data may join that expert's (driving_data.dataset)
        "init_sha256": None if plan.init is None else file_sha256(resolve_path(plan.init)),
        "hyperparameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.record.items()},
    }


@dataclass
class EvaluateArgs:
    env: str | None = option(None, "environment (default: from the expert's card, else carracing)", group="data",
                             choices=ENV_NAMES)
    expert: Path | None = option(None, "expert .zip (default: the env's shipped one)", group="model")
    action_space: str | None = option(None, "expected action space (default: read from the file)", group="model")
    episodes: int = option(20, "episodes (consecutive track seeds)", group="evaluation conditions")
    seed: int = option(1000, "first track seed", group="evaluation conditions")
    max_steps: int | None = option(None, "steps per episode (default: the env's own limit)",
                                   group="evaluation conditions", former=("--max-episode-steps",))
    render: bool = option(False, "use the rendered env instead of physics-only", group="evaluation conditions")
    latency_steps: int = option(0, "actions land D steps after they are chosen (a latency expert is shown D)",
                                group="evaluation conditions")


COMMANDS = {
    "train": (PPOTrainArgs, "Train SB3 PPO on privileged state in the physics-only env, keep the best checkpoint by\n"
                         "a multi-seed validation, write OUT (.zip) and OUT.json (the card)."),
    "evaluate": (EvaluateArgs, "Evaluate an expert with the true env reward on tracks SEED..SEED+EPISODES-1:\n"
                               "mean ± std return and laps finished."),
}


def _evaluate(ns: EvaluateArgs) -> None:
    if ns.episodes <= 0:
        raise ValueError(f"--episodes must be positive, got {ns.episodes}")
    if ns.latency_steps < 0:
        raise ValueError(f"--latency-steps must be >= 0, got {ns.latency_steps}")
    card = _card_of(ns.expert) if ns.expert is not None else {}
    env = ns.env or card.get("env_name", "carracing")
    spec = get_spec(env)
    space = ns.action_space or card.get("action_space")
    if space is None:
        space = _space_of_file(ns.expert) if ns.expert is not None else spec.action_spaces[0]
    expert = Expert.load(ns.expert, space, env)
    t0 = time.time()
    if expert.max_latency and not ns.latency_steps <= expert.max_latency:
        raise ValueError(f"--latency-steps {ns.latency_steps}: {expert.path} was trained for up to "
                         f"{expert.max_latency} steps")
    latencies = [ns.latency_steps] * ns.episodes if ns.latency_steps or expert.max_latency else None
    res = evaluate_model(expert.model, spec, space, range(ns.seed, ns.seed + ns.episodes), render=ns.render,
                         max_episode_steps=ns.max_steps, latencies=latencies, max_latency=expert.max_latency)
    print(f"{expert.path} [{env}, {space}, {'rendered' if ns.render else 'physics-only'}]: {res.summary()} "
          f"({time.time() - t0:.0f} s)")
    print("returns: " + " ".join(f"{r:.1f}" for r in res.returns))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = f"{PROG} " + shlex.join(argv)
    return run_command(COMMANDS, lambda args: train(resolve(args), command=command) if isinstance(args, PPOTrainArgs)
                       else _evaluate(args), argv, prog=PROG, doc=__doc__)


def _card_of(path: Path) -> dict[str, Any]:
    card = resolve_path(path).with_suffix(".json")
    return json.loads(card.read_text()) if card.is_file() else {}


def _space_of_file(path: Path) -> str:
    """Action space of the model file (loads it)."""
    p = resolve_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--expert file not found: {str(path)!r}")
    from stable_baselines3 import PPO

    try:
        return space_of(PPO.load(p, device="cpu"))
    except Exception as exc:
        raise ValueError(f"--expert {str(path)!r} is not a loadable SB3 PPO model: {exc}") from exc


if __name__ == "__main__":
    raise SystemExit(main())
