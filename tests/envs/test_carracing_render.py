"""The fast CarRacing renderer (envs/carracing_render.py) against gymnasium's pygame frames.

Two envs with the same track seed, one per renderer, are driven by the same actions (the scripted teacher's,
so the car stays on the road and meets kerbs); their frames are compared on fixed states, every drawn element
is checked to be there (a frame rendered without it must differ where it is), and rewards and info must be
identical at every step (the fast renderer never touches the physics).
"""

import numpy as np
import pytest

from envs.carracing import ScriptedDriver, make_carracing
from envs.carracing_render import LAYERS, FastRenderer

SEEDS = (3, 11)
CHECKPOINTS = (0, 50, 200)  # steps after reset whose frames are kept
CAR = (slice(64, 80), slice(42, 54))  # frame rows/columns the car covers (it sits at (48, 72))
BARS = (slice(84, 96), slice(12, 96))  # the indicator band right of the score: speed, ABS, steering, gyro
SCORE = (slice(84, 96), slice(0, 12))
WORLD = (slice(0, 84), slice(0, 96))


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int16) - b.astype(np.int16))


def _drive(renderer: str, seed: int, actions: list | None = None, steps: int = max(CHECKPOINTS)):
    """Frames at CHECKPOINTS, every step's (reward, terminated, truncated, info), the actions, and the env."""
    env = make_carracing(renderer=renderer)
    obs, info = env.reset(seed=seed)
    teacher = ScriptedDriver()
    frames, log, taken = {0: obs}, [], []
    for t in range(1, steps + 1):
        action = actions[t - 1] if actions is not None else teacher.continuous(info["privileged"])
        taken.append(action)
        obs, reward, term, trunc, info = env.step(action)
        log.append((reward, term, trunc, info))
        if t in CHECKPOINTS:
            frames[t] = obs
    return frames, log, taken, env


@pytest.fixture(scope="module")
def runs():
    """Per seed: the pygame run (teacher-driven) and the fast run on the same actions."""
    out = {}
    for seed in SEEDS:
        ref = _drive("pygame", seed)
        ref[3].close()
        fast = _drive("fast", seed, actions=ref[2])
        out[seed] = (ref, fast)
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("step", CHECKPOINTS)
def test_frames_match_gymnasium(runs, seed, step):
    (ref, _, _, _), (fast, _, _, _) = runs[seed]
    a, b = ref[step], fast[step]
    assert b.shape == a.shape == (96, 96, 3) and b.dtype == np.uint8
    d = _diff(a, b)
    assert d.mean() <= 1.5, f"mean |pygame - fast| {d.mean():.2f} grey levels"
    # and where the small things are: the car and the indicator band
    assert d[CAR].mean() <= 6.0, f"car region differs by {d[CAR].mean():.2f}"  # (a missing car: ~15)
    assert d[BARS].mean() <= 1.5 and d[SCORE].mean() <= 1.5, (d[BARS].mean(), d[SCORE].mean())
    assert np.percentile(d, 99) <= 60


def test_physics_untouched(runs):
    """Rewards, termination and every info value are the same with either renderer."""
    for seed in SEEDS:
        (_, ref_log, _, _), (_, fast_log, _, _) = runs[seed]
        assert len(ref_log) == len(fast_log)
        for (r1, te1, tr1, i1), (r2, te2, tr2, i2) in zip(ref_log, fast_log):
            assert (r1, te1, tr1) == (r2, te2, tr2)
            assert i1.keys() == i2.keys()
            np.testing.assert_array_equal(i1["privileged"], i2["privileged"])
            assert all(i1[k] == i2[k] for k in i1 if k != "privileged")


def test_deterministic(runs):
    seed = SEEDS[0]
    (_, _, actions, _), (first, _, _, _) = runs[seed]
    again, *_ = _drive("fast", seed, actions=actions)
    for step in CHECKPOINTS:
        np.testing.assert_array_equal(first[step], again[step])


def test_every_element_is_drawn(runs):
    """Leaving one element out must change the frame where that element is (so a renderer that forgot it fails)."""
    seed = SEEDS[0]
    _, (_, _, actions, _) = runs[seed]
    _, _, _, env = _drive("fast", seed, actions=actions, steps=50)  # moving: speed, wheel and steering bars lit
    base = env.unwrapped
    renderer = base._fast
    full = renderer.render(base)
    np.testing.assert_array_equal(full, base.state)  # render() repeats the observation exactly
    where = {"car": CAR, "indicators": BARS, "score": SCORE, "road": WORLD, "grass": WORLD}
    floor = {"car": 8.0, "indicators": 2.0, "score": 10.0, "road": 5.0, "grass": 1.0}
    for layer in LAYERS:
        without = renderer.render(base, layers=[x for x in LAYERS if x != layer])
        d = _diff(full, without)
        region = where[layer]
        assert d[region].mean() >= floor[layer], f"{layer}: frame without it differs by only {d[region].mean():.2f}"
        outside = np.ones(d.shape[:2], bool)
        outside[region] = False
        if layer in ("car", "indicators", "score"):
            assert d[outside].max() == 0, f"{layer} leaks outside its region"
    bare = renderer.render(base, layers=[])  # nothing but the playfield's colour and the black band
    assert (bare[:84] == bare[0, 0]).all() and not bare[84:].any()


def test_rare_indicator_layouts_match_gymnasium():
    """Bars taller than the band (wheel spin) and a gyro bar crossing the steering bar take the slow path."""
    envs = [make_carracing(renderer=r) for r in ("pygame", "fast")]
    frames = []
    for env in envs:
        env.reset(seed=5)
        for _ in range(30):
            env.step(np.array([0.0, 1.0, 0.0], np.float32))
        car = env.unwrapped.car
        car.wheels[2].omega = 2000.0  # the bar reaches far above the band (rows 48..)
        car.wheels[0].omega = -300.0  # hangs below
        car.hull.angularVelocity = 12.0  # the gyro bar crosses the steering bar
        frames.append(env.unwrapped._render("state_pixels"))
    d = _diff(*frames)
    assert d.mean() <= 1.5 and d[84:].mean() <= 1.5, (d.mean(), d[84:].mean())
    assert frames[1][50:84, 22:24, 2].min() > 200  # the tall (blue) bar is there, over the world


def test_video_frames_stay_gymnasium():
    env = make_carracing(renderer="fast", render_mode="rgb_array")
    obs, _ = env.reset(seed=2)
    assert obs.shape == (96, 96, 3)
    assert env.render().shape == (400, 600, 3)  # rgb_array (videos) is still pygame's


def test_bad_arguments():
    from envs.registry import get_spec

    with pytest.raises(ValueError, match="renderer"):
        make_carracing(renderer="bogus")
    with pytest.raises(ValueError, match="renderer"):
        get_spec("carracing").make("continuous", renderer="bogus")
    with pytest.raises(ValueError, match="supersample"):
        FastRenderer(supersample=0)
    with pytest.raises(ValueError, match="car_supersample"):
        FastRenderer(car_supersample=1.5)
    env = make_carracing(renderer="fast")
    env.reset(seed=1)
    with pytest.raises(ValueError, match="layers"):
        env.unwrapped._fast.render(env.unwrapped, layers=["car", "sky"])
    assert FastRenderer().render(make_carracing(renderer="fast").unwrapped) is None  # before any reset
