"""Frame encoders: shapes on the sizes we use, per-frame independence, the one uint8 -> float conversion."""
import pytest
import torch

from policies.encoders import ENCODERS, CarRacingCNN, PilotNet, build_encoder, encoder_features
from policies.frames import frames_to_float


@pytest.mark.parametrize("name,size", [("carracing", (96, 96)), ("carracing", (32, 32)),
                                       ("pilotnet", (66, 200)), ("pilotnet", (96, 96))])
def test_encoder_maps_windows_to_features(name, size):
    enc = build_encoder(name, size, feature_dim=24).eval()
    frames = torch.randint(0, 256, (2, 3, *size, 3), dtype=torch.uint8)
    out = enc(frames_to_float(frames, size))
    assert out.shape == (2, 3, 24) and torch.isfinite(out).all()


@pytest.mark.parametrize("cls", [CarRacingCNN, PilotNet])
def test_frames_are_encoded_independently(cls):
    """TimeDistributed: a frame's feature does not depend on its neighbours in time or batch."""
    enc = cls(image_size=(96, 96), feature_dim=16).eval()
    x = torch.rand(2, 4, 3, 96, 96)
    together = enc(x)
    alone = torch.stack([enc(x[b: b + 1, t: t + 1])[0, 0] for b in range(2) for t in range(4)]).view(2, 4, 16)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    x2 = x.clone()
    x2[:, 0] = 0.0
    torch.testing.assert_close(enc(x2)[:, 1:], together[:, 1:], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(enc(x2)[:, 0], together[:, 0])


def test_paper_cnn_layers():
    enc = CarRacingCNN()
    convs = [m for m in enc.convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (10, (3, 3), (2, 2)), (20, (5, 5), (2, 2)), (30, (5, 5), (2, 2))]
    assert enc.dropout.p == pytest.approx(0.2)
    assert enc.proj.in_features == 30 * 9 * 9  # 96 -> 47 -> 22 -> 9


def test_pilotnet_layers():
    enc = PilotNet()
    convs = [m for m in enc.convs if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [24, 36, 48, 64, 64]
    assert [c.kernel_size[0] for c in convs] == [5, 5, 5, 3, 3]
    assert any(isinstance(m, torch.nn.ELU) for m in enc.convs)


def test_frames_to_float_converts_once_and_resizes():
    frames = torch.randint(0, 256, (2, 5, 20, 30, 3), dtype=torch.uint8)
    x = frames_to_float(frames, (20, 30))
    assert x.shape == (2, 5, 3, 20, 30) and x.dtype == torch.float32
    torch.testing.assert_close(x[1, 2, 0], frames[1, 2, :, :, 0].float() / 255)
    floats = frames.float() / 255
    torch.testing.assert_close(frames_to_float(floats, (20, 30)), x)  # floats are taken as [0, 1]
    assert frames_to_float(frames, (10, 15)).shape == (2, 5, 3, 10, 15)
    with pytest.raises(ValueError, match="channels last"):
        frames_to_float(torch.zeros(2, 3, 8, 8), (8, 8))


def test_bad_encoder_arguments():
    with pytest.raises(ValueError, match="valid encoders: " + ", ".join(ENCODERS)):
        build_encoder("resnet", (96, 96), 32)
    with pytest.raises(ValueError, match="too small"):
        build_encoder("pilotnet", (32, 32), 32)
    enc = build_encoder("carracing", (32, 32), 8)
    with pytest.raises(ValueError, match=r"\[B, T, 3, 32, 32\]"):
        enc(torch.rand(1, 2, 3, 40, 40))


@pytest.mark.parametrize("name, size, features, scale", [("carracing-official", (96, 96), 2430, (255.0, 0.0)),
                                                         ("pilotnet-official", (66, 200), 1152, (2.0, -1.0))])
def test_official_encoders_output_their_conv_map_channels_last(name, size, features, scale):
    """The authors' trainers' stacks: no projection (feature_dim is not read), the map flattened height, width,
    channel as Keras flattens it, their pixel scale, Glorot-uniform kernels and zero biases."""
    enc = build_encoder(name, size, feature_dim=64).eval()
    assert enc.feature_dim == encoder_features(name, size, 64) == features
    assert encoder_features("carracing", size, 64) == 64
    x = torch.rand(2, 1, 3, *size)
    out = enc(x)
    conv_map = enc.convs(x[:, 0] * scale[0] + scale[1])  # [B, C, H, W]
    assert out.shape == (2, 1, features)
    torch.testing.assert_close(out[:, 0], conv_map.permute(0, 2, 3, 1).reshape(2, -1))
    convs = [m for m in enc.convs if isinstance(m, torch.nn.Conv2d)]
    assert all(not c.bias.detach().any() for c in convs)
    fan = convs[0].in_channels * convs[0].kernel_size[0] ** 2 + convs[0].out_channels * convs[0].kernel_size[0] ** 2
    assert float(convs[0].weight.detach().abs().max()) <= (6 / fan) ** 0.5
    dropouts = [m.p for m in enc.convs if isinstance(m, torch.nn.Dropout)]
    assert dropouts == ([0.2] * 3 if name.startswith("carracing") else [])
