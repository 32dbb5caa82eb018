"""agent/training/diagnostics.py: what an attention core's TensorBoard shows (scalars, NAC's histograms, the attention
map as an image) and the comparison table's columns it returns, on a tiny policy over 32x32 frames; nothing for
cores without attention or windows of one token."""
import numpy as np
import pytest
import torch

from agent.training.data import Data
from agent.training.diagnostics import log_nac_internals
from envs.carracing import SPEC as CARRACING
from policies.config import PolicyConfig
from policies.policy import DrivingPolicy

WINDOW, SIZE, FRAMES = 4, 32, 12


class _Writer:
    """TensorBoard's SummaryWriter as far as the diagnostics use it: what was added, by tag."""

    def __init__(self):
        self.scalars, self.histograms, self.images = {}, {}, {}

    def add_scalar(self, tag, value, step):
        self.scalars[tag] = (value, step)

    def add_histogram(self, tag, values, step):
        self.histograms[tag] = values

    def add_image(self, tag, image, step, dataformats):
        self.images[tag] = (image, dataformats)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return Data(frames=[rng.integers(0, 255, (FRAMES, SIZE, SIZE, 3), dtype=np.uint8)], side_frames={},
                times=[np.arange(FRAMES) * 0.02], targets=[np.zeros((FRAMES, 3), np.float32)], env=CARRACING,
                action_names=["steer", "gas", "brake"], action_space="continuous", frame_period=0.02,
                image_size=[SIZE, SIZE], crop=None, camera_width=SIZE, num_episodes=1)


def _policy(core, window=WINDOW, **options):
    torch.manual_seed(0)
    return DrivingPolicy(PolicyConfig.for_actions("continuous", core=core, core_options=options, window=window,
                                                  frame_stride=1, feature_dim=8, image_size=[SIZE, SIZE]))


def test_a_nac_core_shows_its_attention_its_phi_and_omega_and_returns_the_tables_columns(data):
    writer, policy = _Writer(), _policy("nac", d_model=16, heads=4)
    columns = log_nac_internals(writer, policy, data, 0, step=7, cols=None)
    assert set(columns) == {"attn_entropy", "attn_entropy_norm", "attn_max_weight"}
    assert 0 < columns["attn_entropy_norm"] <= 1 + 1e-6 and 0 < columns["attn_max_weight"] <= 1
    assert writer.scalars["attention/entropy"] == (pytest.approx(columns["attn_entropy"]), 7)
    assert writer.scalars["attention/uniform_max_weight"][0] <= columns["attn_max_weight"] + 1e-6, \
        "no attention is flatter than uniform"
    assert {"nac/phi", "nac/omega"} <= set(writer.histograms)
    image, layout = writer.images["nac/attention"]
    assert layout == "CHW" and image.shape == (1, 16 * WINDOW, 16 * WINDOW), "a query row, a key column per token"
    assert float(image.max()) == pytest.approx(1.0) and float(image.min()) >= 0
    upper = image[0, 0, 16:]  # the first query sees no later key: causal
    assert float(upper.abs().max()) == 0.0
    assert not policy.training, "evaluated in eval mode"


def test_an_mha_core_draws_its_map_under_its_own_name_without_nacs_histograms(data):
    writer = _Writer()
    columns = log_nac_internals(writer, _policy("mha", d_model=16, heads=2), data, 0, step=1, cols=None)
    assert "mha/attention" in writer.images and not any(t.startswith("nac/") for t in writer.histograms)
    assert set(columns) == {"attn_entropy", "attn_entropy_norm", "attn_max_weight"}


def test_nothing_is_logged_for_a_core_without_attention_or_a_window_of_one_token(data):
    writer = _Writer()
    assert log_nac_internals(writer, _policy("lstm", hidden=8), data, 0, step=1, cols=None) == {}
    assert log_nac_internals(writer, _policy("nac", window=1, d_model=16, heads=4), data, 0, step=1, cols=None) == {}
    assert writer.scalars == writer.histograms == writer.images == {}, "no NaN entropy where there is no choice"
