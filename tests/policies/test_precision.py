"""--precision: auto picks bf16 only where it trains faster (AMX, a GPU's native bf16), saying why; fp32 is the
plain float32 path bit for bit, bf16 moves the encoder's batches (never a one-frame step) to bfloat16 and nothing
after it."""
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import precision
from policies.config import PolicyConfig
from policies.frames import frames_to_float
from policies.checkpoint import load_checkpoint
from policies.policy import DrivingPolicy
from policies.precision import BF16_MIN_FRAMES, resolve

SIZE = 48


def cpu_with(monkeypatch, amx: bool, avx512_bf16: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)


@pytest.mark.parametrize("flags, expected, why", [
    ({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "bf16", "this CPU has AMX (amx_bf16); bf16 trained "
                                                                        "1.71x as fast"),
    ({"avx2", "avx512f", "avx512_bf16"}, "fp32", "this CPU has avx512_bf16 but no AMX; bf16 measured slower there "
                                                 "(0.63x"),
    ({"avx2", "fma"}, "fp32", "this CPU has neither AMX nor avx512_bf16, so bf16 would be emulated; measured slower"),
    (set(), "fp32", "this CPU has neither AMX nor avx512_bf16"),
])
def test_auto_on_a_cpu_is_bf16_only_with_amx_and_says_why(monkeypatch, flags, expected, why):
    """The CPU's flags given (not this machine's): bf16 only where it trained faster, AMX; the reason in one line."""
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: pytest.fail("the given flags decide"))
    choice = precision.choose("auto", "cpu", flags=flags)
    assert choice.precision == expected and choice.reason.startswith("auto: " + why), choice
    assert choice.line() == f"precision: {expected} ({choice.reason})" and "\n" not in choice.line()
    assert choice.record() == {"precision": expected, "reason": choice.reason}
    for asked in ("fp32", "bf16"):  # asked for: as asked, on any CPU
        assert precision.choose(asked, "cpu", flags=flags) == precision.Choice(asked, f"asked for: --precision {asked}")


@pytest.mark.parametrize("amx, avx512_bf16, expected", [(False, False, "fp32"), (True, False, "bf16"),
                                                        (False, True, "fp32"), (True, True, "bf16")])
def test_torchs_probes_give_the_cpus_flags(monkeypatch, amx, avx512_bf16, expected):
    cpu_with(monkeypatch, amx, avx512_bf16)
    assert precision.cpu_bf16_flags() == {f for f, has in (("amx_bf16", amx), ("avx512_bf16", avx512_bf16)) if has}
    assert resolve("auto", "cpu") == expected
    assert resolve("fp32", "cpu") == "fp32" and resolve("bf16", "cpu") == "bf16"  # asked for: as asked


def test_without_torchs_probes_the_cpus_flags_decide(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu avx512f\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "sse", "avx2", "avx512f"}
    read = precision.cpu_flags
    monkeypatch.setattr(precision, "cpu_flags", lambda: read(cpuinfo))
    assert resolve("auto", "cpu") == "fp32"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert resolve("auto", "cpu") == "fp32"  # AVX-512-BF16 without AMX: slower in bf16
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert resolve("auto", "cpu") == "bf16"
    assert read(tmp_path / "none") == set()  # no such file (not Linux): nothing native


@pytest.mark.parametrize("native, expected", [(False, "fp32"), (True, "bf16")])
def test_auto_on_a_gpu_follows_its_bf16_support(monkeypatch, native, expected):
    cpu_with(monkeypatch, True, True)  # the CPU's support does not decide for the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")
    assert resolve("auto", "cuda") == expected
    assert precision.choose("auto", "cuda").reason == (
        "auto: this GPU (Old GPU) runs bf16 natively" if native else "auto: this GPU (Old GPU) has no native bf16")
    if native:
        assert resolve("bf16", "cuda") == "bf16"
    else:
        with pytest.raises(ValueError, match=r"^--precision bf16: this GPU \(Old GPU\) does not run bfloat16"):
            resolve("bf16", "cuda")


@pytest.mark.parametrize("native", [False, True])
def test_a_gpus_support_can_be_given(native):
    """No GPU needed: the GPU's native bf16 given decides auto, whatever the CPU's flags."""
    choice = precision.choose("auto", "cuda", flags=set(), native_gpu_bf16=native)
    assert choice.precision == ("bf16" if native else "fp32") and choice.reason.startswith("auto: this GPU (")
    assert precision.choose("auto", "cpu", flags={"amx_bf16"}, native_gpu_bf16=False).precision == "bf16"


def test_a_bad_value_is_one_line():
    with pytest.raises(ValueError, match=r"^--precision must be one of auto, fp32, bf16, got 'fp16'$"):
        resolve("fp16", "cpu")
    with pytest.raises(ValueError, match="resolve auto first"):
        make_policy().use_precision("auto")


def make_policy(encoder="carracing", size=SIZE) -> DrivingPolicy:
    torch.manual_seed(0)
    config = PolicyConfig.for_actions("continuous", encoder=encoder, core="nac",
                                      core_options={"d_model": 16, "heads": 4},
                                      image_size=[size, size] if encoder == "carracing" else [66, 200],
                                      feature_dim=16, window=4, frame_stride=1)
    return DrivingPolicy(config)


def frames(n, shape=(SIZE, SIZE), seed=0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (1, n, *shape, 3), dtype=np.uint8))


def test_fp32_is_the_plain_float32_encoder_bit_for_bit():
    """Forward and gradients of encode() at fp32 equal the encoder called directly on the float frames."""
    policy = make_policy().use_precision("fp32")
    x = frames(16)
    torch.manual_seed(1)  # the same dropout draws
    emb = policy.encode(x)
    emb.square().sum().backward()
    got = [p.grad.clone() for p in policy.encoder.parameters()]
    policy.zero_grad()
    torch.manual_seed(1)
    direct = policy.encoder(frames_to_float(x, [SIZE, SIZE]))
    direct.square().sum().backward()
    assert emb.dtype == torch.float32 and torch.equal(emb, direct)
    assert all(torch.equal(a, p.grad) for a, p in zip(got, policy.encoder.parameters()))


@pytest.mark.parametrize("encoder", ["carracing", "pilotnet"])
def test_bf16_runs_the_encoders_batches_in_bfloat16_and_returns_float32(encoder):
    policy = make_policy(encoder)
    shape = (SIZE, SIZE) if encoder == "carracing" else (66, 200)
    x = frames(BF16_MIN_FRAMES + 4, shape)
    torch.manual_seed(1)  # the same dropout draws
    fp32 = policy.encode(x)
    torch.manual_seed(1)
    bf16 = policy.use_precision("bf16").encode(x)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)  # it did run in bf16
    assert (bf16 - fp32).norm() / fp32.norm() < 0.02  # bf16's 8 bits of mantissa, not another function
    bf16.square().sum().backward()  # gradients reach the fp32 weights, in fp32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in policy.encoder.parameters())


def test_fewer_frames_than_pays_and_everything_after_the_encoder_stay_fp32():
    """A closed-loop step (one frame) under bf16 is the fp32 step exactly; the core and head never run in bf16."""
    a, b = make_policy().eval(), make_policy().eval().use_precision("bf16")
    x = frames(BF16_MIN_FRAMES - 1)
    assert torch.equal(a.encode(x), b.encode(x))
    sa, sb = a.stream(), b.stream()
    for i in range(6):
        frame = frames(1, seed=i)[0, 0]
        assert torch.equal(sa.step(frame), sb.step(frame))
    emb = torch.randn(3, 4, 16)
    assert torch.equal(a.raw_from_embeddings(emb), b.raw_from_embeddings(emb))


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "checkpoints").glob("*.pt"))


def camera_frames(gym_id: str, n: int) -> np.ndarray:
    """``n`` frames of the env a student was trained on, as its camera sees them: the car held still (neutral
    action) on the first collection track."""
    from envs.registry import neutral_action, spec_for_gym_id

    spec = spec_for_gym_id(gym_id)
    env = spec.make(spec.action_spaces[0])
    try:
        obs, _ = env.reset(seed=spec.seeds.collect)
        frames = [obs]
        while len(frames) < n:
            frames.append(env.step(neutral_action(env.action_space))[0])
    finally:
        env.close()
    return np.stack(frames)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_shipped_students_drive_as_before_under_both_precisions(path):
    """Step by step (a drive) bf16 is fp32 exactly; over an episode (batches) of their env's camera frames their
    actions agree to well within what a student's steering error is (continuous: 0.01, a sixth of the real-frame
    student's validation MAE; discrete: the same likeliest action). The shipped students differ by at most 0.004
    there (pixel noise, which no camera sees, moves the real-frame student by up to 0.012)."""
    fp32, bf16 = load_checkpoint(path), load_checkpoint(path).use_precision("bf16")
    c = fp32.config
    episode = camera_frames(c.env, 24)
    a, b = fp32.stream(), bf16.stream()
    for frame in episode[:6]:
        assert torch.equal(a.step(frame), b.step(frame))
    exact, rounded = fp32.predict_episode(episode), bf16.predict_episode(episode)
    assert not np.array_equal(exact, rounded)  # the batch did run in bf16
    if c.head == "discrete":
        assert (exact.argmax(1) == rounded.argmax(1)).all()
        probs = [torch.softmax(torch.from_numpy(x), 1) for x in (exact, rounded)]
        assert (probs[0] - probs[1]).abs().max() < 0.01
    else:
        assert np.abs(exact - rounded).max() < 0.01
