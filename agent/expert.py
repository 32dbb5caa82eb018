"""The privileged PPO expert for CarRacing-v3: training, evaluation and a small inference wrapper.

The expert is an SB3 PPO MlpPolicy that reads `info["privileged"]` (envs.carracing.FEATURE_NAMES), not
pixels, so it trains in the physics-only env at thousands of steps/s and acts every frame. Its labels
are what the student imitates from the frames.

    python -m agent.expert train --action-space continuous --timesteps 1500000 \
        --out checkpoints/expert_carracing_continuous.zip
    python -m agent.expert evaluate --expert checkpoints/expert_carracing_continuous.zip --episodes 20 --seed 1000

Design choices (why):
* Continuous PPO acts in [steer, throttle] in [-1, 1]^2 (throttle > 0 = gas, < 0 = brake; steer is scaled to
  the ±0.4 rad wheel limit) — gas and brake together never help, and one axis halves the exploration.
  `Expert.act` always returns the env action [steer, gas, brake].
* Reward shaping (training only): a penalty for every tile the car passes without touching (a single
  skipped tile means the lap never finishes and the return is capped near 880), a small penalty for
  wheels on the grass, a bonus for the lap-finished termination, and an early end after a long time
  fully on the grass. Evaluation always uses the true env reward.
* Tracks: training draws seeds from [TRAIN_SEED_LOW, TRAIN_SEED_HIGH) (all >= 100000), so no seed below
  100000 was ever trained on; checkpoint selection uses VALIDATION_SEEDS, the card reports CARD_EVAL_SEEDS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from envs.carracing import (
    ACTION_SPACES,
    FEATURE_NAMES,
    LOOKAHEAD_STEPS,
    N_FEATURES,
    TRACK_DETAIL_STEP,
    PrivilegedObservation,
    make_carracing,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXPERT_PATHS: dict[str, Path] = {
    "continuous": Path("checkpoints/expert_carracing_continuous.zip"),
    "discrete": Path("checkpoints/expert_carracing_discrete.zip"),
}
TRAIN_SEED_LOW, TRAIN_SEED_HIGH = 100_000, 2_000_000
VALIDATION_SEEDS: tuple[int, ...] = tuple(range(90_000, 90_020))
CARD_EVAL_SEEDS: tuple[int, ...] = tuple(range(1000, 1020))
STEER_SCALE = 0.4  # PPO steer in [-1, 1] -> env steer in [-0.4, 0.4] (the wheel joint limit)


# --------------------------------------------------------------------------------------------- actions
def ppo_to_env_action(action: np.ndarray) -> np.ndarray:
    """Map the continuous PPO action [steer, throttle] to the env action [steer, gas, brake]."""
    a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
    throttle = float(a[1])
    return np.array([STEER_SCALE * a[0], max(throttle, 0.0), max(-throttle, 0.0)], dtype=np.float32)


class SteerThrottleAction(gym.ActionWrapper):
    """Exposes a Box(-1, 1, (2,)) [steer, throttle] action space on top of continuous CarRacing."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def action(self, action: np.ndarray) -> np.ndarray:
        return ppo_to_env_action(action)


# --------------------------------------------------------------------------------------------- training env
@dataclass
class Shaping:
    """Training-only reward shaping; see the module docstring for why each term exists."""

    skip_penalty: float = 5.0  # per tile left behind untouched
    skip_margin: int = 4  # a tile counts as skipped once the car is this many track points past it
    offroad_penalty: float = 0.05  # per frame, times the fraction of wheels on grass
    lap_bonus: float = 50.0  # on the lap-finished termination
    grass_patience: int = 50  # end the episode after this many frames with all wheels on grass ...
    grass_penalty: float = 100.0  # ... with this penalty (like leaving the playfield; else the policy
    # learns to park on the grass after a crash: driving on past untouched tiles costs skip penalties)


class ShapedReward(gym.Wrapper):
    """Adds the Shaping terms to the env reward (expects CarRacingInfo's info keys)."""

    def __init__(self, env: gym.Env, shaping: Shaping) -> None:
        super().__init__(env)
        self.shaping = shaping

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._n = info["num_tiles"]
        self._progress = info["track_index"]  # unwrapped nearest-point index
        self._checked = 0  # tiles [0, _checked) have been judged visited/skipped
        self._grass = 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        s, n = self.shaping, self._n
        delta = (info["track_index"] - self._progress) % n
        if delta > n // 2:
            delta -= n
        self._progress += delta
        shaped = float(reward)
        road = self.env.unwrapped.road
        while self._checked < min(self._progress - s.skip_margin, n):
            if not road[self._checked].road_visited:
                shaped -= s.skip_penalty
            self._checked += 1
        on_road = float(info["privileged"][FEATURE_NAMES.index("wheels_on_road")])
        shaped -= s.offroad_penalty * (1.0 - on_road)
        if info["lap_complete"] and terminated:
            shaped += s.lap_bonus
        self._grass = self._grass + 1 if on_road == 0.0 else 0
        if self._grass >= s.grass_patience and not terminated:
            terminated = True
            shaped -= s.grass_penalty
        return obs, shaped, terminated, truncated, info


class RandomTrack(gym.Wrapper):
    """Resets onto a fresh track whose seed is drawn from the training range (never a test seed)."""

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        self._rng = np.random.default_rng(seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        track_seed = int(self._rng.integers(TRAIN_SEED_LOW, TRAIN_SEED_HIGH)) if seed is None else seed
        return self.env.reset(seed=track_seed, options=options)


def make_expert_env(action_space: str, *, render: bool = False, max_episode_steps: int = 1000) -> gym.Env:
    """The env the expert acts in: privileged obs, PPO action space ([steer, throttle] or Discrete(5))."""
    env = PrivilegedObservation(make_carracing(action_space, render=render, max_episode_steps=max_episode_steps))
    if action_space == "continuous":
        env = SteerThrottleAction(env)
    return env


def make_train_env(action_space: str, seed: int, shaping: Shaping) -> gym.Env:
    return RandomTrack(ShapedReward(make_expert_env(action_space, render=False), shaping), seed)


# --------------------------------------------------------------------------------------------- scripted teacher
_F = {name: i for i, name in enumerate(FEATURE_NAMES)}
_AHEAD_DIST = np.asarray(LOOKAHEAD_STEPS, dtype=np.float64) * TRACK_DETAIL_STEP
_AHEAD_X = [_F[f"ahead{k}_x"] for k in LOOKAHEAD_STEPS]
_AHEAD_Y = [_F[f"ahead{k}_y"] for k in LOOKAHEAD_STEPS]
_AHEAD_CURV = [_F[f"ahead{k}_curv"] for k in LOOKAHEAD_STEPS]


@dataclass(frozen=True)
class ScriptedDriver:
    """Pure pursuit + curvature speed profile on the privileged features (the BC warm-start teacher).

    Steering aims at the centerline point `lookahead * speed` units ahead (6..40) with yaw-rate damping;
    the target speed is the lowest over the look-ahead points of sqrt(v_corner^2 + 2 a_brake d), with
    v_corner = sqrt(a_lat / |curvature|); gas is cut while the driven rear wheels spin (traction control).
    Discrete: steer when the steering command exceeds `steer_threshold`, else brake / gas / noop.
    """

    lookahead: float = 0.4  # s: look-ahead distance per unit speed
    kp: float = 2.0  # steer per rad of pursuit angle
    kd: float = 0.15  # steer per rad/s of yaw rate
    a_lat: float = 200.0  # units/s^2 allowed in corners
    a_brake: float = 60.0  # units/s^2 braking envelope
    slip_max: float = 0.1  # rear_slip feature above which gas is cut
    steer_threshold: float = 0.15  # discrete only

    def continuous(self, p: np.ndarray) -> np.ndarray:
        """Env action [steer, gas, brake]."""
        v = float(p[_F["v_forward"]]) * 50.0
        xs, ys = p[_AHEAD_X] * 30.0, p[_AHEAD_Y] * 30.0
        dist = float(np.clip(self.lookahead * v, 6.0, 40.0))
        alpha = math.atan2(float(np.interp(dist, _AHEAD_DIST, xs)), float(np.interp(dist, _AHEAD_DIST, ys)))
        steer = float(np.clip(self.kp * alpha - self.kd * float(p[_F["yaw_rate"]]) * 3.0, -1.0, 1.0))
        curv = np.maximum(np.abs(p[_AHEAD_CURV].astype(np.float64)) / 10.0, 1e-3)
        v_target = float(np.min(np.sqrt(self.a_lat / curv + 2 * self.a_brake * np.maximum(_AHEAD_DIST - 4.0, 0.0))))
        gas = brake = 0.0
        if v < v_target:
            gas = 1.0 if p[_F["rear_slip"]] < self.slip_max else 0.0
        elif v > v_target + 5.0:
            brake = 0.8 * min(1.0, 0.1 * (v - v_target))
        return np.array([STEER_SCALE * steer, gas, brake], dtype=np.float32)

    def discrete(self, p: np.ndarray) -> int:
        steer, gas, brake = self.continuous(p)
        if abs(steer) > STEER_SCALE * self.steer_threshold:
            return 1 if steer > 0 else 2
        return 4 if brake > 0 else 3 if gas > 0 else 0

    def ppo_action(self, p: np.ndarray, action_space: str) -> np.ndarray | int:
        """The label in PPO's action space ([steer, throttle] or the discrete index)."""
        if action_space == "discrete":
            return self.discrete(p)
        steer, gas, brake = self.continuous(p)
        return np.array([steer / STEER_SCALE, gas - brake], dtype=np.float32)


def collect_teacher_data(
    action_space: str, episodes: int, seed: int, shaping: Shaping, gamma: float, driver: ScriptedDriver
) -> dict[str, np.ndarray]:
    """Drive the teacher on training tracks with perturbations (so off-centre recoveries are seen);
    label every visited state with the teacher's action and the discounted shaped return."""
    rng = np.random.default_rng(seed)
    obs_l, act_l, ret_l = [], [], []
    for ep in range(episodes):
        env = make_train_env(action_space, seed * 7919 + ep, shaping)
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
                push = env.action_space.sample() if action_space == "discrete" else rng.uniform(-1, 1, 2)
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
    return {"obs": np.asarray(obs_l, np.float32), "action": np.asarray(act_l, dtype), "return": np.asarray(ret_l, np.float32)}


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


# --------------------------------------------------------------------------------------------- the expert
def _check_action_space(action_space: str) -> None:
    if action_space not in ACTION_SPACES:
        raise ValueError(f"action_space must be one of {ACTION_SPACES}, got {action_space!r}")


def _resolve(path: Path) -> Path:
    """Relative paths are tried from the cwd first, then from the repo root (so tests run anywhere)."""
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def _space_of(model: Any) -> str:
    if isinstance(model.action_space, gym.spaces.Discrete):
        return "discrete"
    return "continuous"


class Expert:
    """A trained PPO expert: deterministic env actions from the privileged feature vector."""

    def __init__(self, model: Any, action_space: str, card: dict[str, Any], path: Path | None = None) -> None:
        self.model = model
        self.action_space = action_space
        self.card = card
        self.path = path

    @classmethod
    def load(cls, path: str | Path | None = None, action_space: str = "continuous") -> "Expert":
        """Load an SB3 PPO .zip (and its JSON card). path=None -> the shipped expert for `action_space`."""
        from stable_baselines3 import PPO

        _check_action_space(action_space)
        p = _resolve(Path(path) if path is not None else DEFAULT_EXPERT_PATHS[action_space])
        if not p.is_file():
            raise FileNotFoundError(
                f"expert file not found: {str(p)!r} (expected an SB3 PPO .zip; train one with "
                f"`python -m agent.expert train --action-space {action_space} --out {p}`)"
            )
        try:
            model = PPO.load(p, device="cpu")
        except Exception as exc:  # corrupt zip, not an SB3 file, ...
            raise ValueError(f"expert file {str(p)!r} is not a loadable SB3 PPO model: {exc}") from exc
        got = _space_of(model)
        if got != action_space:
            raise ValueError(f"expert file {str(p)!r} is a {got!r} expert, but action_space={action_space!r} was requested")
        if model.observation_space.shape != (N_FEATURES,):
            raise ValueError(
                f"expert file {str(p)!r} expects observations of shape {model.observation_space.shape}, "
                f"but envs.carracing provides {N_FEATURES} privileged features"
            )
        card_path = p.with_suffix(".json")
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
        return cls(model, action_space, card, p)

    def _obs(self, privileged: np.ndarray) -> np.ndarray:
        obs = np.asarray(privileged, dtype=np.float32)
        if obs.shape != (N_FEATURES,):
            raise ValueError(f"privileged must have shape ({N_FEATURES},), got {obs.shape}")
        return obs

    def act(self, privileged: np.ndarray) -> np.ndarray | int:
        """Deterministic env action: float32[3] [steer, gas, brake] or an int in 0..4."""
        action, _ = self.model.predict(self._obs(privileged), deterministic=True)
        if self.action_space == "discrete":
            return int(action)
        return ppo_to_env_action(action)

    def action_probs(self, privileged: np.ndarray) -> np.ndarray:
        """Discrete experts only: the policy's probabilities of the 5 actions, float32[5]."""
        import torch

        if self.action_space != "discrete":
            raise ValueError("action_probs is only defined for a discrete expert, this one is 'continuous'")
        obs, _ = self.model.policy.obs_to_tensor(self._obs(privileged))
        with torch.no_grad():
            probs = self.model.policy.get_distribution(obs).distribution.probs
        return probs[0].cpu().numpy().astype(np.float32)


# --------------------------------------------------------------------------------------------- evaluation
@dataclass
class EvalResult:
    seeds: list[int]
    returns: list[float]
    lengths: list[int]
    laps: list[bool]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def summary(self) -> str:
        return (
            f"return {self.mean:.1f} ± {self.std:.1f} over {len(self.returns)} episodes "
            f"(seeds {self.seeds[0]}..{self.seeds[-1]}), laps finished {sum(self.laps)}/{len(self.laps)}, "
            f"mean length {np.mean(self.lengths):.0f} frames"
        )


def evaluate_model(model: Any, action_space: str, seeds: Sequence[int], *, render: bool = False) -> EvalResult:
    """Run one deterministic episode per track seed with the TRUE env reward; envs step in lockstep
    so the policy runs batched."""
    envs = [make_expert_env(action_space, render=render) for _ in seeds]
    obs = np.stack([env.reset(seed=int(s))[0] for env, s in zip(envs, seeds)])
    returns = np.zeros(len(seeds))
    lengths = np.zeros(len(seeds), dtype=int)
    laps = [False] * len(seeds)
    alive = np.ones(len(seeds), dtype=bool)
    while alive.any():
        idx = np.flatnonzero(alive)
        actions, _ = model.predict(obs[idx], deterministic=True)
        for j, a in zip(idx, actions):
            o, r, term, trunc, info = envs[j].step(a)
            obs[j] = o
            returns[j] += r
            lengths[j] += 1
            if term or trunc:
                alive[j] = False
                laps[j] = bool(info["lap_complete"])
    for env in envs:
        env.close()
    return EvalResult(list(map(int, seeds)), returns.tolist(), lengths.tolist(), laps)


# --------------------------------------------------------------------------------------------- training
@dataclass
class TrainArgs:
    action_space: str = "continuous"
    timesteps: int = 1_500_000
    out: Path = Path("checkpoints/expert_carracing_continuous.zip")
    seed: int = 0
    n_envs: int = 8
    eval_every: int = 50_000  # env steps between multi-seed validations
    eval_episodes: int = len(VALIDATION_SEEDS)
    card_episodes: int = len(CARD_EVAL_SEEDS)
    learning_rate: float = 3e-4
    n_steps: int = 512
    batch_size: int = 512
    ent_coef: float = 0.0
    init: Path | None = None  # warm-start from an existing expert .zip (fine-tuning)
    bc_episodes: int = 0  # > 0: behaviour-clone the ScriptedDriver on this many training tracks first
    bc_epochs: int = 30
    log_std_init: float = -0.5  # continuous only; use ~-1.6 when fine-tuning a cloned policy
    target_kl: float | None = None  # PPO early stop per update (protects a warm-started policy)
    logdir: Path = Path("runs/expert")
    shaping: Shaping = field(default_factory=Shaping)

    def validate(self) -> None:
        _check_action_space(self.action_space)
        for name in ("timesteps", "n_envs", "eval_every", "eval_episodes", "card_episodes", "n_steps", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.eval_episodes > len(VALIDATION_SEEDS):
            raise ValueError(f"--eval-episodes must be <= {len(VALIDATION_SEEDS)}, got {self.eval_episodes}")
        if self.out.suffix != ".zip":
            raise ValueError(f"--out must end in .zip (an SB3 model file), got {str(self.out)!r}")
        if self.bc_episodes < 0 or self.bc_epochs <= 0:
            raise ValueError(f"--bc-episodes must be >= 0 and --bc-epochs > 0, got {self.bc_episodes}, {self.bc_epochs}")
        if self.init is not None and self.bc_episodes:
            raise ValueError("--init and --bc-episodes are exclusive (both choose the starting policy)")
        if self.init is not None and not _resolve(self.init).is_file():
            raise FileNotFoundError(f"--init expert file not found: {str(self.init)!r}")


def _atomic_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _atomic_save(model: Any, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.zip")
    model.save(tmp)
    os.replace(tmp, path)


def _make_best_callback(args: TrainArgs, best_path: Path, log: Any):
    from stable_baselines3.common.callbacks import BaseCallback

    class BestByMultiSeedEval(BaseCallback):
        """Every `eval_every` env steps: deterministic episodes on VALIDATION_SEEDS (true reward);
        keep the checkpoint with the best mean return (ties broken by laps finished)."""

        def __init__(self) -> None:
            super().__init__()
            self.best: tuple[float, float] = (-math.inf, -math.inf)
            self.best_step = 0
            self.best_result: EvalResult | None = None
            self.history: list[dict[str, Any]] = []
            self._next = args.eval_every

        def _on_training_start(self) -> None:
            if args.bc_episodes or args.init is not None:  # the warm start itself is a candidate
                self.evaluate()

        def _on_step(self) -> bool:
            if self.num_timesteps >= self._next:
                self._next += args.eval_every
                self.evaluate()
            return True

        def evaluate(self) -> None:
            res = evaluate_model(self.model, args.action_space, VALIDATION_SEEDS[: args.eval_episodes])
            self.logger.record("eval/mean_return", res.mean)
            self.logger.record("eval/std_return", res.std)
            self.logger.record("eval/laps_finished", sum(res.laps) / len(res.laps))
            self.history.append({"timesteps": self.num_timesteps, "mean": res.mean, "std": res.std, "laps": sum(res.laps)})
            score = (res.mean, float(sum(res.laps)))
            tag = ""
            if score > self.best:
                self.best, self.best_step, self.best_result = score, self.num_timesteps, res
                _atomic_save(self.model, best_path)
                tag = "  <- best"
            log(f"[{self.num_timesteps:>8d}] validation {res.summary()}{tag}")

        def _on_training_end(self) -> None:
            if self.num_timesteps > self.best_step and self.history and self.history[-1]["timesteps"] != self.num_timesteps:
                self.evaluate()

    return BestByMultiSeedEval()


def train(args: TrainArgs, *, command: str | None = None, log: Any = print) -> Path:
    """Train a PPO expert, keep the best checkpoint by multi-seed validation, write .zip + JSON card."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    args.validate()
    torch.set_num_threads(1)
    t0 = time.time()
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    run_name = f"{args.action_space}_seed{args.seed}_{time.strftime('%Y%m%d-%H%M%S')}"
    venv = VecMonitor(
        DummyVecEnv(
            [
                (lambda i=i: make_train_env(args.action_space, args.seed * 1000 + i, args.shaping))
                for i in range(args.n_envs)
            ]
        )
    )
    init_card = None
    if args.init is not None:
        init_json = _resolve(args.init).with_suffix(".json")
        init_card = json.loads(init_json.read_text()) if init_json.is_file() else None
        model = PPO.load(_resolve(args.init), env=venv, device="cpu", learning_rate=args.learning_rate,
                         n_steps=args.n_steps, batch_size=args.batch_size, ent_coef=args.ent_coef,
                         target_kl=args.target_kl, tensorboard_log=str(args.logdir), seed=args.seed)
        if _space_of(model) != args.action_space:
            raise ValueError(f"--init {str(args.init)!r} is not a {args.action_space!r} expert")
    else:
        model = PPO(
            "MlpPolicy",
            venv,
            learning_rate=args.learning_rate,
            n_steps=args.n_steps,
            batch_size=args.batch_size,
            n_epochs=10,
            gamma=0.99,
            gae_lambda=0.95,
            clip_range=0.2,
            ent_coef=args.ent_coef,
            max_grad_norm=0.5,
            target_kl=args.target_kl,
            policy_kwargs=dict(net_arch=dict(pi=[128, 128], vf=[128, 128]),
                               **({"log_std_init": args.log_std_init} if args.action_space == "continuous" else {})),
            tensorboard_log=str(args.logdir),
            seed=args.seed,
            device="cpu",
            verbose=0,
        )
    teacher = ScriptedDriver()
    if args.bc_episodes:
        tb = time.time()
        data = collect_teacher_data(args.action_space, args.bc_episodes, args.seed, args.shaping, model.gamma, teacher)
        log(f"teacher data: {len(data['obs'])} states from {args.bc_episodes} training tracks ({time.time() - tb:.0f} s)")
        behaviour_clone(model, data, epochs=args.bc_epochs, seed=args.seed, log=log)
    best_path = out.with_name(out.stem + ".best.tmp.zip")
    callback = _make_best_callback(args, best_path, log)
    model.learn(total_timesteps=args.timesteps, callback=callback, tb_log_name=run_name, progress_bar=False)
    if callback.best_result is None:  # shorter than one validation period
        callback.evaluate()
    best = PPO.load(best_path, device="cpu")
    res = evaluate_model(best, args.action_space, CARD_EVAL_SEEDS[: args.card_episodes])
    log(f"card evaluation (unseen seeds): {res.summary()}")
    os.replace(best_path, out)
    card = {
        "env": "CarRacing-v3 (gymnasium), envs.carracing.make_carracing, physics-only for training/eval",
        "action_space": args.action_space,
        "policy_action": "[steer, throttle] in [-1,1]^2 -> env [0.4*steer, max(throttle,0), max(-throttle,0)]"
        if args.action_space == "continuous" else "Discrete(5): 0 noop, 1 right, 2 left, 3 gas, 4 brake",
        "algorithm": "stable-baselines3 PPO, MlpPolicy (pi/vf 128x128) on the privileged observation, "
        + (f"fine-tuned from {args.init}" if args.init else
           f"behaviour-cloned from the scripted driver agent.expert.ScriptedDriver ({args.bc_episodes} perturbed "
           f"training tracks, {args.bc_epochs} epochs) then PPO fine-tuned" if args.bc_episodes else "PPO from scratch")
        + f"; shipped checkpoint = best validation at {callback.best_step} PPO timesteps"
        + (" (i.e. the behaviour-cloned policy before any PPO update)" if callback.best_step == 0 and args.bc_episodes else ""),
        "teacher": asdict(teacher) if args.bc_episodes else None,
        "init_card": init_card,  # how the --init policy was obtained (its command reproduces it)
        "features": list(FEATURE_NAMES),
        "timesteps": int(model.num_timesteps),
        "best_checkpoint_timesteps": int(callback.best_step),
        "train_seeds": f"track seeds drawn uniformly from [{TRAIN_SEED_LOW}, {TRAIN_SEED_HIGH})",
        "selection": {"seeds": list(VALIDATION_SEEDS[: args.eval_episodes]), "mean_return": callback.best[0],
                      "history": callback.history},
        "evaluation": {"seeds": res.seeds, "mean_return": res.mean, "std_return": res.std,
                       "laps_finished": int(sum(res.laps)), "episodes": len(res.seeds),
                       "returns": [round(r, 2) for r in res.returns], "lengths": res.lengths,
                       "reward": "true env reward, deterministic policy"},
        "shaping": asdict(args.shaping),
        "hyperparameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items() if k != "shaping"},
        "wall_time_s": round(time.time() - t0, 1),
        "command": command or "",
        "tensorboard": str(args.logdir / f"{run_name}_1"),
    }
    _atomic_json(out.with_suffix(".json"), card)
    venv.close()
    log(f"saved {out} and {out.with_suffix('.json')} ({card['wall_time_s']:.0f} s)")
    return out


# --------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent.expert",
        description="Train or evaluate the privileged PPO expert that labels CarRacing demonstrations.",
        epilog="examples:\n"
        "  python -m agent.expert train --action-space continuous --timesteps 8192 --bc-episodes 120 \\\n"
        "      --log-std-init -1.6 --eval-every 4096 --out checkpoints/expert_carracing_continuous.zip\n"
        "  python -m agent.expert evaluate --expert checkpoints/expert_carracing_continuous.zip --episodes 20 --seed 1000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train SB3 PPO on the privileged observation (physics-only env)",
                       description="Train SB3 PPO on privileged state in the physics-only env, keep the best "
                       "checkpoint by a multi-seed validation, write OUT (.zip) and OUT.json (the card).")
    d = TrainArgs()
    t.add_argument("--action-space", choices=ACTION_SPACES, required=True, help="env action space the expert drives")
    t.add_argument("--timesteps", type=int, default=d.timesteps, help="total env steps (default %(default)s)")
    t.add_argument("--out", type=Path, required=True, help="output .zip; the card is written beside it as .json")
    t.add_argument("--seed", type=int, default=d.seed, help="RNG seed for PPO and the training-track draws")
    t.add_argument("--n-envs", type=int, default=d.n_envs, help="envs in the DummyVecEnv (default %(default)s)")
    t.add_argument("--eval-every", type=int, default=d.eval_every, help="env steps between validations")
    t.add_argument("--eval-episodes", type=int, default=d.eval_episodes, help="validation tracks per validation")
    t.add_argument("--card-episodes", type=int, default=d.card_episodes, help="unseen tracks for the card (seeds 1000..)")
    t.add_argument("--learning-rate", type=float, default=d.learning_rate)
    t.add_argument("--n-steps", type=int, default=d.n_steps, help="rollout length per env")
    t.add_argument("--batch-size", type=int, default=d.batch_size)
    t.add_argument("--ent-coef", type=float, default=d.ent_coef)
    t.add_argument("--init", type=Path, default=None, help="warm-start from this expert .zip (fine-tune)")
    t.add_argument("--bc-episodes", type=int, default=d.bc_episodes,
                   help="behaviour-clone the scripted pure-pursuit driver on this many training tracks before PPO (0 = off)")
    t.add_argument("--bc-epochs", type=int, default=d.bc_epochs)
    t.add_argument("--log-std-init", type=float, default=d.log_std_init, help="continuous: initial log std of the policy")
    t.add_argument("--target-kl", type=float, default=None, help="PPO per-update KL early stop")
    t.add_argument("--logdir", type=Path, default=d.logdir, help="TensorBoard root (default %(default)s)")
    e = sub.add_parser("evaluate", help="mean ± std return and laps finished over consecutive track seeds",
                       description="Evaluate an expert with the true env reward on tracks SEED..SEED+EPISODES-1.")
    e.add_argument("--expert", type=Path, default=None, help="expert .zip (default: the shipped one)")
    e.add_argument("--action-space", choices=ACTION_SPACES, default=None,
                   help="expected action space (default: read from the file)")
    e.add_argument("--episodes", type=int, default=20)
    e.add_argument("--seed", type=int, default=1000, help="first track seed")
    e.add_argument("--render", action="store_true", help="use the rendered env instead of physics-only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        if ns.cmd == "train":
            args = TrainArgs(
                action_space=ns.action_space, timesteps=ns.timesteps, out=ns.out, seed=ns.seed, n_envs=ns.n_envs,
                eval_every=ns.eval_every, eval_episodes=ns.eval_episodes, card_episodes=ns.card_episodes,
                learning_rate=ns.learning_rate, n_steps=ns.n_steps, batch_size=ns.batch_size,
                ent_coef=ns.ent_coef, init=ns.init, logdir=ns.logdir, bc_episodes=ns.bc_episodes,
                bc_epochs=ns.bc_epochs, log_std_init=ns.log_std_init, target_kl=ns.target_kl,
            )
            train(args, command="python -m agent.expert " + shlex.join(argv))
        else:
            if ns.episodes <= 0:
                raise ValueError(f"--episodes must be positive, got {ns.episodes}")
            space = ns.action_space
            if space is None:
                space = _space_of_file(ns.expert) if ns.expert is not None else "continuous"
            expert = Expert.load(ns.expert, space)
            t0 = time.time()
            res = evaluate_model(expert.model, space, range(ns.seed, ns.seed + ns.episodes), render=ns.render)
            print(f"{expert.path} [{space}, {'rendered' if ns.render else 'physics-only'}]: {res.summary()} "
                  f"({time.time() - t0:.0f} s)")
            print("returns: " + " ".join(f"{r:.1f}" for r in res.returns))
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    return 0


def _space_of_file(path: Path) -> str:
    """Action space recorded in the card beside `path` (falls back to loading the model)."""
    p = _resolve(path)
    card = p.with_suffix(".json")
    if card.is_file():
        space = json.loads(card.read_text()).get("action_space")
        if space in ACTION_SPACES:
            return space
    if not p.is_file():
        raise FileNotFoundError(f"--expert file not found: {str(path)!r}")
    from stable_baselines3 import PPO

    try:
        return _space_of(PPO.load(p, device="cpu"))
    except Exception as exc:
        raise ValueError(f"--expert {str(path)!r} is not a loadable SB3 PPO model: {exc}") from exc


if __name__ == "__main__":
    raise SystemExit(main())
