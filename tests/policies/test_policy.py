"""DrivingPolicy: config round trip, checkpoints that rebuild themselves, streaming == batched, actions;
the same for the attention cores' block structures and NAC's departures from the paper."""
import json

import numpy as np
import pytest
import torch

from agent.training.windows import WindowDataset, window_indices
from driving_data.dataset import open_dataset, write_episode
from policies.actions import DISCRETE_ACTIONS, DiscreteChooser, at_temperature, check_discrete_options, spared_ids
from policies.cores import CORES, policy_core_options
from policies.nac import NAC
from policies.config import PolicyConfig
from policies.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from policies.policy import DrivingPolicy

SIZE = 32


def tiny_config(core="nac", head="continuous", **kw) -> PolicyConfig:
    small = {"nac": {"d_model": 16, "heads": 4}, "ltc": {"units": 8}, "mha": {"d_model": 16, "heads": 2}}
    base = dict(core=core, core_options=small.get(core, {}), image_size=[SIZE, SIZE], feature_dim=16,
                window=4, frame_stride=1)
    if head == "continuous":
        base.update(target_mean=[0.1, 0.5, 0.05], target_std=[0.4, 0.3, 0.1])
    base.update(kw)
    return PolicyConfig.for_actions(head, **base)


def make_policy(*args, **kw) -> DrivingPolicy:
    torch.manual_seed(0)
    return DrivingPolicy(tiny_config(*args, **kw)).eval()


def random_frames(n, size=SIZE, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def test_config_round_trips_through_json():
    cfg = tiny_config("mha", core_options={"d_model": 16, "heads": 2, "positions": "sinusoidal"})
    again = PolicyConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.action_dim == 3
    with pytest.raises(ValueError, match="unknown fields"):
        PolicyConfig.from_dict({**cfg.to_dict(), "colour": "red"})
    with pytest.raises(ValueError, match="unknown core"):
        PolicyConfig(core="rnn").validate()
    with pytest.raises(ValueError, match="window"):
        PolicyConfig(window=0).validate()
    with pytest.raises(ValueError, match="is for a discrete head"):
        PolicyConfig(discrete_actions="sample").validate()
    with pytest.raises(ValueError, match="discrete_actions must be one of"):
        PolicyConfig.for_actions("discrete", discrete_actions="greedy").validate()


def test_discrete_action_rules_take_each_action_as_often_as_the_softmax_says():
    """sample draws each action as often as its softmax probability says (the same draws for the same seed); dither
    does so deterministically, never more than one step off its share at any step; argmax always the likeliest."""
    discrete = make_policy("mlp", head="discrete")
    logits = torch.log(torch.tensor([0.1, 0.6, 0.3, 1e-9, 1e-9]))
    share = np.array([0.1, 0.6, 0.3, 0.0, 0.0])
    sample = DiscreteChooser("sample", seed=7)
    drawn = [discrete.to_env_action(logits, sample) for _ in range(4000)]
    assert np.bincount(drawn, minlength=5) / 4000 == pytest.approx(share, abs=0.03)
    again = DiscreteChooser("sample", seed=7)
    assert [discrete.to_env_action(logits, again) for _ in range(100)] == drawn[:100]
    dither = DiscreteChooser("dither")
    taken = np.zeros(5)
    for step in range(1, 201):
        taken[discrete.to_env_action(logits, dither)] += 1
        assert np.all(np.abs(taken - step * share) < 1.0 + 1e-9), (step, taken)
    assert taken.tolist() == [20, 120, 60, 0, 0]
    assert {discrete.to_env_action(logits) for _ in range(20)} == {1}
    assert {discrete.to_env_action(logits, DiscreteChooser("argmax")) for _ in range(20)} == {1}
    with pytest.raises(ValueError, match="one of"):
        DiscreteChooser("softmax")


def test_action_temperature_reshapes_the_softmax_the_rules_draw_from():
    """At temperature T sample and dither take each action in proportion to p ** (1 / T): above 1 the minority
    actions come more often, T = 1 is the plain softmax, a tiny T is argmax; argmax refuses a temperature, and
    a temperature must be a number > 0 (a checkpoint's config is checked alike)."""
    discrete = make_policy("mlp", head="discrete")
    p = np.array([0.1, 0.6, 0.3, 0.0, 0.0])
    logits = torch.log(torch.tensor(p) + 1e-12).float()
    for t in (0.5, 2.0):
        share = p ** (1 / t) / (p ** (1 / t)).sum()
        sample = DiscreteChooser("sample", seed=3, temperature=t)
        drawn = [discrete.to_env_action(logits, sample) for _ in range(4000)]
        assert np.bincount(drawn, minlength=5) / 4000 == pytest.approx(share, abs=0.03)
        dither, taken = DiscreteChooser("dither", temperature=t), np.zeros(5)
        for _ in range(400):
            taken[discrete.to_env_action(logits, dither)] += 1
        assert taken / 400 == pytest.approx(share, abs=1 / 400 + 1e-9)
    plain, one = DiscreteChooser("sample", seed=5), DiscreteChooser("sample", seed=5, temperature=1.0)
    assert [plain(p) for _ in range(200)] == [one(p) for _ in range(200)]
    cold = DiscreteChooser("sample", seed=5, temperature=1e-3)
    assert {cold(p) for _ in range(200)} == {1}
    with pytest.raises(ValueError, match="only the sample and dither rules"):
        DiscreteChooser("argmax", temperature=1.5)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1.5"):
        with pytest.raises(ValueError, match="must be a number > 0"):
            DiscreteChooser("sample", temperature=bad)
    with pytest.raises(ValueError, match="only the sample and dither rules"):
        PolicyConfig.for_actions("discrete", action_temperature=1.5).validate()
    assert PolicyConfig.for_actions("discrete", discrete_actions="sample", action_temperature=1.5).validate()


def test_spared_actions_keep_their_probability_and_the_rest_share_the_remainder_at_the_temperature():
    """--temperature-spares brake: brake keeps its temperature-1 probability; the other actions split what is left
    in proportion to p ** (1 / T). Nothing spared is the plain temperature; T = 1 changes nothing; sample draws from
    the spared distribution; unknown names, or every action spared, are refused."""
    p = np.array([[0.02, 0.10, 0.20, 0.66, 0.02], [0.0, 0.3, 0.1, 0.2, 0.4]])
    hot = at_temperature(p, 1.5, spared_ids("brake"))
    np.testing.assert_allclose(hot[:, 4], p[:, 4])
    np.testing.assert_allclose(hot.sum(axis=1), 1.0)
    share = p[:, :4] ** (1 / 1.5)
    np.testing.assert_allclose(hot[:, :4], share / share.sum(axis=1, keepdims=True) * (1 - p[:, 4:]))
    plain = p ** (1 / 1.5)
    np.testing.assert_allclose(at_temperature(p, 1.5), plain / plain.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(at_temperature(p, 1.0, spared_ids("brake")), p)
    assert hot[0, 3] < p[0, 3] and hot[0, 0] > p[0, 0]  # gas gives way to the minority pulses, brake does not grow
    chooser = DiscreteChooser("sample", seed=7, temperature=1.5, spared=spared_ids(["brake"]))
    drawn = np.bincount([chooser(p[0]) for _ in range(20000)], minlength=5) / 20000
    assert drawn == pytest.approx(hot[0], abs=0.01)
    assert spared_ids(None) == () and spared_ids("noop, brake") == (0, 4)
    for bad, needle in (("handbrake", "must be names of"), ("", "must be names of"),
                        (",".join(DISCRETE_ACTIONS), "leaves the temperature nothing")):
        with pytest.raises(ValueError, match=needle):
            spared_ids(bad)


def test_discrete_options_are_refused_in_the_names_the_caller_gave_them():
    """A rule other than argmax, a temperature or spared actions on a continuous student, and a temperature other
    than 1 or spared actions on one that drives argmax, are refused with the caller's names; the rest pass."""
    flags = ("--discrete-actions", "--action-temperature", "--temperature-spares")
    for head, own, rule, temperature, spared, needle in (
            ("continuous", "argmax", "sample", None, False, "--discrete-actions sample is for discrete students; "
                                                            "checkpoint 'a.pt' has a continuous head"),
            ("continuous", "argmax", None, 1.0, False, "--action-temperature is for discrete"),
            ("continuous", "argmax", None, None, True, "--temperature-spares is for discrete"),
            ("discrete", "argmax", None, 1.5, False,
             r"--action-temperature changes only the sample and dither rules; checkpoint 'a.pt' drives argmax "
             r"\(add --discrete-actions sample\)"),
            ("discrete", "sample", "argmax", None, True, "--temperature-spares changes only")):
        with pytest.raises(ValueError, match=needle):
            check_discrete_options(head, own, rule, temperature, spared, "checkpoint 'a.pt'", flags)
    for head, own, rule, temperature, spared in (("continuous", "argmax", "argmax", None, False),
                                                 ("discrete", "argmax", None, 1.0, False),
                                                 ("discrete", "sample", None, 1.5, True),
                                                 ("discrete", "argmax", "dither", 2.0, True)):
        check_discrete_options(head, own, rule, temperature, spared, "checkpoint 'a.pt'", flags)
    with pytest.raises(ValueError, match="^temperature is for discrete students; s has a continuous head$"):
        check_discrete_options("continuous", "argmax", None, 2.0, False, "s")


def test_heads_and_env_actions():
    frames = random_frames(2 * 4).view(2, 4, SIZE, SIZE, 3)
    discrete = make_policy("mlp", head="discrete")
    logits = discrete(frames)
    assert logits.shape == (2, 5)
    assert discrete.to_env_action(torch.tensor([0.1, 0.0, 3.0, 0.2, -1.0])) == 2
    cont = make_policy("mlp")
    assert cont(frames).shape == (2, 3)
    action = cont.to_env_action(torch.tensor([-3.0, 0.5, 2.0]))
    assert action.dtype == np.float32 and action.tolist() == [-1.0, 0.5, 1.0]
    steer = make_policy("mlp", action_names=["steer"], target_mean=[0.0], target_std=[0.5])
    assert steer(frames).shape == (2, 1) and steer.to_env_action(torch.tensor([1.7])).tolist() == [1.0]
    with pytest.raises(ValueError, match="3 entries"):
        cont.to_env_action(torch.zeros(5))


def test_continuous_output_is_denormalised():
    policy = make_policy("mlp")
    frames = random_frames(4)[None]
    raw = policy.forward_raw(frames)
    torch.testing.assert_close(policy(frames), raw * torch.tensor([0.4, 0.3, 0.1]) + torch.tensor([0.1, 0.5, 0.05]))
    target = torch.tensor([[0.5, 0.2, 0.0]])
    torch.testing.assert_close(policy.normalize_target(target) * policy.target_std + policy.target_mean, target)


@pytest.mark.parametrize("core", list(CORES))
def test_checkpoint_round_trip_gives_identical_outputs(core, tmp_path):
    policy = make_policy(core)
    path = save_checkpoint(tmp_path / "p.pt", policy, metadata={"epoch": 3, "note": "test"})
    payload = torch.load(path, weights_only=True)  # plain data + tensors only
    assert payload["metadata"]["epoch"] == 3 and payload["config"]["core"] == core
    assert {"format", "version", "config", "state_dict"} <= set(payload)
    loaded = load_checkpoint(path)
    assert loaded.config == policy.config and not loaded.training
    frames = random_frames(8).view(2, 4, SIZE, SIZE, 3)
    time = torch.tensor([[-0.06, -0.04, -0.02, 0.0], [-0.04, -0.04, -0.02, 0.0]])
    assert torch.equal(loaded(frames, time), policy(frames, time))
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file


def test_the_official_nac_variant_is_rebuilt_from_its_checkpoint(tmp_path):
    policy = make_policy(core_options={"d_model": 16, "heads": 4, "variant": "official", "mode": "euler",
                                       "euler_steps": 5, "delta_t": 0.5, "activation": "elu"})
    loaded = load_checkpoint(save_checkpoint(tmp_path / "p.pt", policy))
    assert loaded.core.nac.config.variant == "official" and loaded.core.nac.activation == "elu"
    frames = random_frames(8).view(2, 4, SIZE, SIZE, 3)
    assert torch.equal(loaded(frames), policy(frames))
    with pytest.raises(ValueError, match="'nac-official' has none"):
        tiny_config(latency_input="clock", core_options={"variant": "official"}).validate()


def test_bad_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"this is not a checkpoint" * 10)
    with pytest.raises(ValueError, match="text file"):
        load_checkpoint(corrupt)
    good = save_checkpoint(tmp_path / "good.pt", make_policy("mlp"))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupted"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(ValueError, match="not a driving-policy checkpoint"):
        read_checkpoint(foreign)
    payload = torch.load(good, weights_only=True)
    payload["state_dict"].pop("head.weight")
    torch.save(payload, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="cannot rebuild"):
        load_checkpoint(tmp_path / "partial.pt")


def assert_stream_matches_forward(policy, frames, times):
    """Each streamed step equals a batched forward on the window demos.window_indices builds for that step."""
    stream = policy.stream()
    stream.reset()
    for t in range(len(frames)):
        out = stream.step(frames[t].numpy(), float(times[t]))
        idx = window_indices(t, policy.config.window, policy.config.frame_stride)
        rel = torch.from_numpy((times[idx] - times[idx][-1]).astype(np.float32))[None]
        torch.testing.assert_close(out, policy(frames[idx][None], rel)[0], atol=1e-5, rtol=1e-5)
    return stream


@pytest.mark.parametrize("core", list(CORES))
@pytest.mark.parametrize("stride", [1, 3])
def test_stream_equals_batched_forward(core, stride):
    """One frame per step with cached embeddings == forward on the window demos.window_indices builds."""
    policy = make_policy(core, frame_stride=stride)
    T = 12
    frames = random_frames(T, seed=1)
    times = np.arange(T) * 0.02 + 5.0  # absolute clock; only differences matter
    stream = assert_stream_matches_forward(policy, frames, times)
    stream.reset()  # a new episode starts from scratch
    first = stream.step(frames[5])
    idx = window_indices(0, policy.config.window, stride)
    torch.testing.assert_close(first, policy(frames[[5] * len(idx)][None], torch.zeros(1, len(idx)))[0],
                               atol=1e-5, rtol=1e-5)


def test_stream_matches_window_dataset_and_default_clock(tmp_path):
    """The streaming policy sees exactly the windows training sees, with t defaulting to step * frame_period."""
    T = 10
    frames = random_frames(T, seed=2).numpy()
    arrays = dict(frames=frames, action=np.zeros((T, 3), np.float32), expert_action=np.zeros((T, 3), np.float32),
                  reward=np.zeros(T, np.float32), speed=np.zeros(T, np.float32),
                  privileged=np.zeros((T, 2), np.float32), time=np.arange(T) * 0.02)
    write_episode(tmp_path, 0, arrays, {"action_space": "continuous"})
    policy = make_policy("nac", frame_stride=2)
    policy.train()  # stream() must switch to eval mode (dropout off)
    ds = WindowDataset(open_dataset(tmp_path), window=4, frame_stride=2)
    stream = policy.stream()
    assert not policy.training
    for t in range(T):
        out = stream.step(frames[t])  # t=None: the dataset's 0.02 s clock
        item = ds[t]
        torch.testing.assert_close(out, policy(item["frames"][None], item["time"][None])[0], atol=1e-5, rtol=1e-5)


def test_stream_rejects_bad_frames():
    stream = make_policy("mlp").stream()
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        stream.step(np.zeros((2, SIZE, SIZE, 3), np.uint8))


# ----------------------------------------------------------------------------- attention variants
VARIANT_NAMES = ["nac-exact+prenorm", "nac-steady+prenorm+scale=4", "nac-euler+bare+scale", "mha+bare",
                 "nac-exact+prenorm+scale=2+phi_activation=identity"]


def variant_policy(name: str, stride: int = 1) -> DrivingPolicy:
    core, options = policy_core_options(name, d_model=16, heads=4, topk=8)
    if core == "mha":
        options["heads"] = 2
    return make_policy(core, core_options=options, frame_stride=stride)


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_stream_equals_batched_forward_for_attention_variants(name, stride=3):
    """(test_stream_equals_batched_forward covers strides 1 and 3 for every core; one stride suffices here.)"""
    policy = variant_policy(name, stride)
    with torch.no_grad():  # move every weight (the logit scales too) away from its initial value
        for p in policy.core.parameters():
            p.add_(0.05 * torch.randn_like(p))
    T = 10
    frames = random_frames(T, seed=3)
    times = np.arange(T) * 0.02 + 100.0
    assert_stream_matches_forward(policy, frames, times)


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_checkpoint_round_trip_for_attention_variants(name, tmp_path):
    policy = variant_policy(name)
    path = save_checkpoint(tmp_path / "v.pt", policy)
    loaded = load_checkpoint(path)
    assert loaded.config.core_options == policy.config.core_options
    assert loaded.config.core_options["block"] in ("bare", "prenorm")
    frames = random_frames(8).view(2, 4, SIZE, SIZE, 3)
    assert torch.equal(loaded(frames), policy(frames))


def test_a_checkpoint_from_before_blocks_loads_as_the_bare_paper_layer(tmp_path):
    """Checkpoints written before the block option existed (no "block", no logit scale in core_options; the first
    shipped student was one) still load, as the bare paper layer with the same outputs."""
    policy = variant_policy("nac-exact+bare")
    path = save_checkpoint(tmp_path / "old.pt", policy)
    payload = torch.load(path, weights_only=True)
    payload["config"]["core_options"].pop("block")
    torch.save(payload, path)
    loaded = load_checkpoint(path)
    assert "block" not in loaded.config.core_options
    assert loaded.core.block_kind == "bare" and loaded.core.nac.log_logit_scale is None
    frames = random_frames(8).view(2, 4, SIZE, SIZE, 3)
    assert torch.equal(loaded(frames), policy.eval()(frames))


def test_predict_episode_equals_stepping_the_stream():
    """The batched offline prediction (evaluate.py --data) gives what the closed-loop stream gives, irregular
    timestamps included."""
    import numpy as np

    from policies.config import PolicyConfig
    from policies.policy import DrivingPolicy

    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig.for_actions("continuous", ["steer"], encoder="carracing", feature_dim=8,
                                                    core="nac", core_options={"d_model": 16, "heads": 4, "topk": 3},
                                                    window=4, frame_stride=2, image_size=[32, 32])).eval()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (23, 32, 32, 3), dtype=np.uint8)
    times = np.cumsum(rng.uniform(0.05, 0.4, 23))
    stream = policy.stream()
    stepped = np.stack([stream.step(f, t).numpy() for f, t in zip(frames, times)])
    np.testing.assert_allclose(policy.predict_episode(frames, times, batch=5), stepped, atol=1e-5)


def test_time_clock_stream_spans_the_trained_time_under_irregular_frames():
    """clock="time": with every frame on the training clock it picks what clock="steps" picks (same outputs); when
    frames arrive every 1-3 steps it picks, for each trained offset, the newest frame received at or before that
    time, so the window spans the trained 0.06 s instead of the last frames received; the core gets their true
    timestamps."""
    policy = make_policy("nac", frame_stride=1, frame_period=0.02)  # window 4: offsets 0.06, 0.04, 0.02, 0 s
    frames = random_frames(12, seed=4)
    steps, timed = policy.stream("steps"), policy.stream("time")
    for k in range(12):
        torch.testing.assert_close(timed.step(frames[k], 0.02 * k), steps.step(frames[k], 0.02 * k))
    timed.reset()
    arrivals = [0.0, 0.04, 0.10, 0.12, 0.18]  # every 2, 3, 1, 3 steps
    for k, t in enumerate(arrivals):
        out = timed.step(frames[k], t)
    picked = [timed.times[i] for i in timed.picks()]
    assert picked == pytest.approx([0.12, 0.12, 0.12, 0.18]), "wanted 0.12, 0.14, 0.16, 0.18: newest at or before"
    window, rel = timed.window()
    torch.testing.assert_close(rel, torch.tensor([[-0.06, -0.06, -0.06, 0.0]]))
    expected = policy(torch.stack([frames[3], frames[3], frames[3], frames[4]])[None], rel)[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="clock must be one of"):
        policy.stream("frames")


# ---------------------------------------------------------------------------------------------------------------
# A policy told its latency (LATENCY_INPUTS): NAC's query timestamp (clock) or an input feature. Told nothing, or
# told 0 through the clock, a policy answers exactly as untold; the clock moves only the query's time (the keys'
# elapsed times grow by the latency); bad combinations are refused in one line.


TINY = dict(encoder="carracing", image_size=[32, 32], feature_dim=16, window=4, frame_stride=2,
            core_options={"d_model": 16, "heads": 4, "topk": 3})


def _policy(latency_input: str = "none", core: str = "nac", seed: int = 0) -> DrivingPolicy:
    torch.manual_seed(seed)
    options = TINY["core_options"] if core == "nac" else {"hidden": 16}
    config = PolicyConfig.for_actions("continuous", **{**TINY, "core": core, "core_options": options},
                                      latency_input=latency_input)
    return DrivingPolicy(config).eval()


def test_nac_query_time_at_the_last_frame_is_the_plain_forward():
    torch.manual_seed(0)
    layer = NAC(8, 16, 4, topk=3, causal=True, return_sequences=False).eval()
    x, time = torch.randn(3, 5, 8), torch.arange(-4.0, 1.0).expand(3, 5).contiguous()
    plain = layer(x, time=time)
    torch.testing.assert_close(layer(x, time=time, query_time=torch.zeros(3)), plain, rtol=0, atol=0)
    later = layer(x, time=time, query_time=torch.full((3,), 2.0))
    assert not torch.allclose(later, plain)
    # only elapsed times matter: the query 2 later equals every key 2 earlier with the query kept at its frame
    _, inner_later = layer(x, time=time, query_time=torch.full((3,), 2.0), return_internals=True)
    _, inner_shift = layer(x, time=time - 2.0 * (torch.arange(5) < 4), return_internals=True)
    keys_before = inner_shift["index"] < 4  # the window's older keys (the newest is the query's own frame)
    torch.testing.assert_close(inner_later["t"][keys_before], inner_shift["t"][keys_before])
    with pytest.raises(ValueError, match="query_time"):
        layer(x, query_time=torch.zeros(3))  # no timestamps to differ from


def test_a_policy_that_is_not_told_ignores_the_latency_and_clock_zero_changes_nothing():
    frames = torch.randint(0, 255, (2, 4, 32, 32, 3), dtype=torch.uint8)
    time = torch.tensor([[-0.12, -0.08, -0.04, 0.0]] * 2)
    plain = _policy("none")
    ref = plain(frames, time)
    emb = plain.encode(frames)
    torch.testing.assert_close(plain.postprocess(plain.raw_from_embeddings(emb, time, 0.2)), ref, rtol=0, atol=0)
    clock = _policy("clock")
    clock.load_state_dict(plain.state_dict())  # the clock adds no weights: the same student, told its latency
    told_zero = clock.postprocess(clock.raw_from_embeddings(emb, time, 0.0))
    torch.testing.assert_close(told_zero, ref, rtol=0, atol=0)
    assert not torch.allclose(clock.postprocess(clock.raw_from_embeddings(emb, time, 0.2)), ref)


def test_the_input_mode_adds_one_feature_and_the_stream_passes_the_latency():
    policy = _policy("input", core="gru")
    assert policy.core.rnn.input_size == TINY["feature_dim"] + 1
    frame = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    outs = []
    for latency in (0.0, 0.2):
        stream = policy.stream()
        outs.append(stream.step(frame, 0.0, latency))
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("latency_input, core, says", [("clock", "gru", "query a timestamp"),
                                                        ("later", "nac", "latency_input must be one of")])
def test_bad_latency_inputs_are_refused(latency_input, core, says):
    with pytest.raises(ValueError, match=says):
        _policy(latency_input, core=core)


@pytest.mark.parametrize("core", ["nac-prenorm", "gru"])
def test_a_student_that_was_not_told_gets_the_input_and_answers_as_before(core):
    from policies.policy import with_latency_input

    if core == "nac-prenorm":  # the input reaches the core through a dense layer (a bare nac's wiring is sparse)
        torch.manual_seed(0)
        plain = DrivingPolicy(PolicyConfig.for_actions("continuous", **{**TINY, "core_options": {
            **TINY["core_options"], "block": "prenorm"}})).eval()
        with pytest.raises(ValueError, match="train the latency-aware student from scratch"):
            with_latency_input(_policy("none"))
    else:
        plain = _policy("none", core=core)
    told = with_latency_input(plain)
    assert told.config.latency_input == "input"
    frames = torch.randint(0, 255, (2, 4, 32, 32, 3), dtype=torch.uint8)
    time = torch.tensor([[-0.12, -0.08, -0.04, 0.0]] * 2)
    emb = plain.encode(frames)
    ref = plain.postprocess(plain.raw_from_embeddings(emb, time))
    torch.testing.assert_close(told.postprocess(told.raw_from_embeddings(emb, time, 0.2)), ref)
    with pytest.raises(ValueError, match="already told"):
        with_latency_input(told)


def test_a_policy_shown_its_actions_on_their_way_reads_them_and_starts_as_the_one_it_widens():
    """with_latency_input(policy, queue_steps=K): the core reads the latency and K actions (next to land first,
    zeros past the queue's end) beside each frame; the new inputs' weights start at 0, so it answers as before
    whatever the queue, from a student told nothing or told the latency alone; a stream step passes the queue."""
    from policies.policy import with_latency_input

    plain = _policy("none", core="gru")
    frames = torch.randint(0, 255, (2, 4, 32, 32, 3), dtype=torch.uint8)
    time = torch.tensor([[-0.12, -0.08, -0.04, 0.0]] * 2)
    emb = plain.encode(frames)
    queue = torch.rand(2, 3, 3)
    ref = plain.postprocess(plain.raw_from_embeddings(emb, time))
    told = with_latency_input(with_latency_input(plain), queue_steps=5)  # told the latency, then shown the queue
    assert told.config.queue_steps == 5 and told.core.rnn.input_size == TINY["feature_dim"] + 1 + 5 * 3
    torch.testing.assert_close(told.postprocess(told.raw_from_embeddings(emb, time, 0.06, queue)), ref)
    with torch.no_grad():
        told.core.rnn.weight_ih_l0[:, -15:].normal_()
    a = told.raw_from_embeddings(emb, time, 0.06, queue)
    assert not torch.allclose(a, told.raw_from_embeddings(emb, time, 0.06, queue.flip(1)))  # the order is read
    padded = torch.cat([queue, torch.zeros(2, 2, 3)], 1)  # zeros past the end: the same as a shorter queue
    torch.testing.assert_close(told.raw_from_embeddings(emb, time, 0.06, padded), a)
    frame = frames[0, -1].numpy()
    stream = told.stream()
    out = stream.step(frame, 0.0, 0.06, queue[0].numpy())
    torch.testing.assert_close(out, told.postprocess(told.raw_from_embeddings(
        told.encode(torch.as_tensor(frame)[None, None]).expand(1, 4, -1), torch.zeros(1, 4), 0.06, queue[:1]))[0])
    with pytest.raises(ValueError, match="already told"):
        with_latency_input(told, queue_steps=5)
    with pytest.raises(ValueError, match="on_the_way must be"):
        told.raw_from_embeddings(emb, time, 0.06, torch.rand(2, 3, 2))


@pytest.mark.parametrize("options, says", [(dict(latency_input="none", queue_steps=3), "told by 'none'"),
                                           (dict(latency_input="input", queue_steps=-1), "queue_steps must be")])
def test_bad_queue_options_are_refused(options, says):
    with pytest.raises(ValueError, match=says):
        PolicyConfig.for_actions("continuous", **{**TINY, "core": "gru", "core_options": {"hidden": 16}},
                                 **options).validate()


def test_steer_gain_scales_the_steering_alone_before_the_clip_online_and_offline():
    frames = random_frames(4)[None]
    plain = make_policy("mlp")
    gained = make_policy("mlp", steer_gain=1.5)
    assert gained.to_env_action(torch.tensor([0.4, 0.5, 0.2])).tolist() == pytest.approx([0.6, 0.5, 0.2])
    assert gained.to_env_action(torch.tensor([-0.8, 0.5, 0.2])).tolist()[0] == -1.0  # clipped after the gain
    outputs = plain.predict_episode(frames[0].numpy())
    steered = gained.steered(outputs)
    np.testing.assert_allclose(steered[:, 0], 1.5 * outputs[:, 0], rtol=1e-6)
    np.testing.assert_array_equal(steered[:, 1:], outputs[:, 1:])
    np.testing.assert_array_equal(plain.steered(outputs), outputs)  # gain 1 changes nothing


@pytest.mark.parametrize("options, says", [(dict(steer_gain=0.0), "steer_gain must be"),
                                           (dict(steer_gain=5.0), "steer_gain must be"),
                                           (dict(steer_gain="1.2"), "steer_gain must be"),
                                           (dict(head="discrete", steer_gain=1.2), "a discrete head")])
def test_bad_steer_gains_are_refused(options, says):
    with pytest.raises(ValueError, match=says):
        tiny_config("mlp", **options).validate()


def test_the_gain_acts_from_its_threshold_on_and_a_fixed_throttle_replaces_the_predicted_one(tmp_path):
    """The authors' Udacity drive.py: steering x3 where |s| >= 0.01, throttle 0.05 whatever the model says."""
    policy = make_policy("mlp", action_names=["steer", "throttle"], target_mean=[0.0, 0.0], target_std=[1.0, 1.0],
                         steer_gain=3.0, steer_gain_from=0.01, fixed_throttle=0.05)
    assert policy.to_env_action(torch.tensor([0.005, 0.9])).tolist() == pytest.approx([0.005, 0.05])
    assert policy.to_env_action(torch.tensor([-0.2, -0.4])).tolist() == pytest.approx([-0.6, 0.05])
    np.testing.assert_allclose(policy.steered(np.array([[0.009, 0.3], [0.01, 0.3]]))[:, 0], [0.009, 0.03])
    assert policy.throttle_for(0.7) == 0.05 and make_policy("mlp").throttle_for(0.7) == 0.7
    again = load_checkpoint(save_checkpoint(tmp_path / "p.pt", policy))
    assert (again.config.steer_gain_from, again.config.fixed_throttle) == (0.01, 0.05)


@pytest.mark.parametrize("options, says", [(dict(steer_gain_from=1.0), "steer_gain_from must be"),
                                           (dict(fixed_throttle=2.0), "fixed_throttle must be"),
                                           (dict(fixed_throttle=True), "fixed_throttle must be"),
                                           (dict(head="discrete", fixed_throttle=0.1), "not of a discrete one"),
                                           (dict(frame_tokens=4), "needs window 1"),
                                           (dict(head_hidden=-1), "head_hidden must be")])
def test_bad_drive_and_shape_options_are_refused(options, says):
    with pytest.raises(ValueError, match=says):
        tiny_config("mlp", **options).validate()


def test_frame_tokens_cut_the_frame_features_in_order_as_a_keras_reshape_does():
    """window 1, frame_tokens N: the core reads the frame's F features as N tokens of F / N, in their order; the
    stream and a batch agree; a hidden head layer sits between core and actions."""
    policy = make_policy("nac", window=1, feature_dim=24, frame_tokens=6, head_hidden=8,
                         core_options={"d_model": 16, "heads": 4, "variant": "official", "topk": 3})
    assert policy.core.nac.input_dim == 4
    assert [m.out_features for m in policy.head if hasattr(m, "out_features")] == [8, 3]
    emb = torch.arange(2 * 24, dtype=torch.float32).view(2, 1, 24)
    seq, time = policy.core_sequence(emb, torch.zeros(2, 1))
    np.testing.assert_array_equal(seq.numpy(), np.reshape(emb.numpy(), (2, -1, 4)))  # Keras's Reshape: row-major
    assert torch.equal(seq[1, 2], torch.tensor([32.0, 33.0, 34.0, 35.0]))
    assert time[0].tolist() == [-5, -4, -3, -2, -1, 0]
    frames = random_frames(3)
    batch = policy(frames[:, None])
    stream = policy.stream()
    stream.reset()
    torch.testing.assert_close(torch.stack([stream.step(f) for f in frames]), batch, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="does not divide"):
        make_policy("mlp", window=1, feature_dim=10, frame_tokens=4)
