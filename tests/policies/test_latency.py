"""A policy told its latency (policies.policy LATENCY_INPUTS): NAC's query timestamp (clock) or an input feature.

Identities: told nothing, or told 0 through the clock, a policy answers exactly as before; the clock moves only
the query's time (the keys' elapsed times grow by the latency); bad combinations are refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.nac import NAC
from policies.policy import DrivingPolicy, PolicyConfig

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
