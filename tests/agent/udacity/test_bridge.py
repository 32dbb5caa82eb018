"""The Udacity simulator bridge: the telemetry handler without a socket, the CLI's errors, the real protocol, and the
bridge as a process (one torch thread unless asked; SIGTERM stops it with the summary as Ctrl-C does)."""
import base64
import csv
import importlib.util
import logging
import math
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import cv2
import numpy as np
import pytest
import torch

from agent.udacity import bridge as ub
from policies.config import PolicyConfig
from policies.checkpoint import load_checkpoint, save_checkpoint
from policies.policy import DrivingPolicy
from tests.helpers import constant_policy_checkpoint

HAVE_SOCKETIO = all(importlib.util.find_spec(m) is not None for m in ("socketio", "eventlet", "websocket"))
NEEDS_SOCKETIO = pytest.mark.skipif(not HAVE_SOCKETIO, reason="python-socketio/eventlet/websocket-client not installed "
                                                              "(pip install -e '.[bridge]' plus websocket-client)")
TIMEOUT_S = 10.0  # no socket wait in this file may take longer


def _udacity_policy(**overrides) -> DrivingPolicy:
    """A tiny PilotNet steering policy with the udacity recipe (crop, 66x200, YUV)."""
    options = dict(encoder="pilotnet", image_size=[66, 200], crop=[60, 135], color="yuv", env="UdacityStyle-v0",
                   core="lstm", core_options={"hidden": 8}, window=3, frame_stride=1, feature_dim=8,
                   frame_period=0.1)
    options.update(overrides)
    return DrivingPolicy(PolicyConfig.for_actions("continuous", ["steer"], **options))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    return save_checkpoint(tmp_path_factory.mktemp("bridge") / "steer.pt", _udacity_policy())


def _frames(n: int = 4) -> list[np.ndarray]:
    """Distinct camera-sized RGB frames (smooth, so JPEG keeps them close)."""
    rows, cols = np.mgrid[0:160, 0:320]
    out = []
    for k in range(n):
        f = np.stack([(cols * (0.5 + 0.2 * k)) % 256, (rows * (1.5 - 0.3 * k)) % 256,
                      np.full_like(rows, 40 * k)], axis=-1)
        out.append(f.astype(np.uint8))
    return out


def _jpeg_b64(rgb: np.ndarray) -> str:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return base64.b64encode(buf.tobytes()).decode("ascii")


def _telemetry(rgb: np.ndarray, speed: float = 10.0) -> dict:
    return {"steering_angle": "0.0", "throttle": "0.0", "speed": str(speed), "image": _jpeg_b64(rgb)}


class _Clock:
    """A fake monotonic clock: starts at 100 s, advances 0.1 s per call."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.1
        return self.now


# ------------------------------------------------------------------------------- the handler, no socket
def test_decode_image_is_rgb():
    red = np.zeros((160, 320, 3), np.uint8)
    red[..., 0] = 255
    frame, jpeg = ub.decode_image(_jpeg_b64(red))
    assert frame.shape == (160, 320, 3) and frame.dtype == np.uint8
    assert frame[..., 0].mean() > 240 and frame[..., 2].mean() < 15  # red stays in channel 0 (BGR undone)
    assert jpeg[:2] == b"\xff\xd8"


def test_reply_strings_match_the_policy_stream(checkpoint):
    server = ub.SteeringServer(load_checkpoint(checkpoint), clock=_Clock())
    reference = load_checkpoint(checkpoint).stream()
    for k, rgb in enumerate(_frames(4)):
        payload = _telemetry(rgb, speed=8.0)
        reply = server.on_telemetry(payload)
        assert set(reply) == {"steering_angle", "throttle"}
        assert all(isinstance(v, str) for v in reply.values())
        steering, throttle = float(reply["steering_angle"]), float(reply["throttle"])
        frame, _ = ub.decode_image(payload["image"])
        expected = float(reference.step(frame, 0.1 * k)[0])  # seconds since the first frame
        assert -1.0 <= steering <= 1.0
        assert steering == pytest.approx(expected, abs=1e-6)
        assert throttle == pytest.approx(1 - steering ** 2 - (8.0 / 25.0) ** 2, abs=1e-9)
    assert server.frames == 4 and len(server.latencies_ms) == 4 and server.errors == 0
    assert "served 4 frames" in server.summary() and "median" in server.summary()


def test_steering_is_clipped_and_read_from_the_steer_output(tmp_path):
    policy = DrivingPolicy(PolicyConfig.for_actions("continuous", ["gas", "steer"], core="mlp", window=1,
                                                    feature_dim=8, core_options={"hidden": 8}))
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.copy_(torch.tensor([0.3, -4.0]))  # gas 0.3, steer far past full left
    path = save_checkpoint(tmp_path / "clip.pt", policy)
    reply = ub.SteeringServer(ub.load_policy(path)).on_telemetry(_telemetry(_frames(1)[0], speed=0.0))
    assert float(reply["steering_angle"]) == -1.0
    assert float(reply["throttle"]) == 0.0  # 1 - (-1)^2 - 0


@pytest.mark.parametrize("steering, speed, limit, expected", [
    (0.0, 0.0, 25.0, 1.0), (0.5, 0.0, 25.0, 0.75), (0.0, 12.5, 25.0, 0.75), (0.2, 10.0, 20.0, 0.71),
    (0.0, 30.0, 25.0, 0.0), (-1.0, 5.0, 25.0, 0.0)])
def test_throttle_formula(steering, speed, limit, expected):
    assert ub.throttle_for(steering, speed, limit) == pytest.approx(expected)


def test_speed_limit_option_changes_throttle(checkpoint):
    server = ub.SteeringServer(load_checkpoint(checkpoint), speed_limit=10.0)
    reply = server.on_telemetry(_telemetry(_frames(1)[0], speed=9.0))
    s = float(reply["steering_angle"])
    assert float(reply["throttle"]) == pytest.approx(max(0.0, 1 - s ** 2 - 0.81), abs=1e-9)


@pytest.mark.parametrize("payload", [None, {}, ""])
def test_manual_mode(checkpoint, payload):
    server = ub.SteeringServer(load_checkpoint(checkpoint))
    assert server.on_telemetry(payload) is None
    assert server.manual == 1 and server.frames == 0


@pytest.mark.parametrize("payload, words", [
    ({"speed": "3", "image": "this is not base64!"}, "image"),
    ({"speed": "3", "image": base64.b64encode(b"not a jpeg at all").decode()}, "JPEG"),
    ({"speed": "3", "image": ""}, "image"),
    ({"speed": "fast", "image": "AAAA"}, "speed"),
    ({"image": "AAAA"}, "speed"),
    (["not", "a", "dict"], "dict"),
])
def test_bad_payload_is_logged_not_raised(checkpoint, caplog, payload, words):
    server = ub.SteeringServer(load_checkpoint(checkpoint))
    with caplog.at_level(logging.ERROR, logger="agent.udacity.bridge"):
        reply = server.on_telemetry(payload)
    assert reply == {"steering_angle": "0.0", "throttle": "0.0"}  # let go of the gas, wheel straight
    assert server.errors == 1 and server.frames == 0
    assert any(words in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert server.on_telemetry(_telemetry(_frames(1)[0])) is not None  # the next good frame is served


def test_reset_restarts_the_stream_and_clock(checkpoint):
    frames = _frames(3)
    server = ub.SteeringServer(load_checkpoint(checkpoint), clock=_Clock())
    first = server.on_telemetry(_telemetry(frames[0]))
    server.on_telemetry(_telemetry(frames[1]))
    server.reset()
    assert server.on_telemetry(_telemetry(frames[0])) == first


def test_record_writes_the_simulator_format(checkpoint, tmp_path):
    rec = ub.Recorder(tmp_path / "rec")
    server = ub.SteeringServer(load_checkpoint(checkpoint), recorder=rec)
    replies = [server.on_telemetry(_telemetry(f, speed=4.5)) for f in _frames(3)]
    rec.close()
    with open(tmp_path / "rec" / "driving_log.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 3 and all(len(r) == 7 for r in rows)
    names = [r[0] for r in rows]
    assert len(set(names)) == 3 and all(n.split("/")[-1].startswith("center_") for n in names)
    for row, reply in zip(rows, replies):
        assert row[1] == row[2] == "" and row[5] == "0" and float(row[6]) == 4.5
        assert float(row[3]) == float(reply["steering_angle"]) and float(row[4]) == float(reply["throttle"])
        assert cv2.imread(row[0]).shape == (160, 320, 3)


# ------------------------------------------------------------------------------- policy checks and CLI errors
def test_refuses_policies_that_cannot_steer(tmp_path):
    discrete = constant_policy_checkpoint(tmp_path / "discrete.pt", action_space="discrete")
    with pytest.raises(ValueError, match="continuous"):
        ub.load_policy(discrete)
    torch.manual_seed(0)
    no_steer = DrivingPolicy(PolicyConfig.for_actions("continuous", ["gas", "brake"], core="mlp", window=1,
                                                      feature_dim=8, core_options={"hidden": 8}))
    with pytest.raises(ValueError, match="steer"):
        ub.load_policy(save_checkpoint(tmp_path / "nosteer.pt", no_steer))
    queued = DrivingPolicy(PolicyConfig.for_actions("continuous", ["steer"], core="mlp", window=1, feature_dim=8,
                                                    core_options={"hidden": 8}, latency_input="input", queue_steps=2))
    with pytest.raises(ValueError, match="actions on their way"):
        ub.load_policy(save_checkpoint(tmp_path / "queued.pt", queued))


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, words", [
    (["{missing}"], "does not exist"),
    (["{garbage}"], "not a driving-policy checkpoint"),
    (["{discrete}"], "continuous"),
    (["{ckpt}", "--port", "70000"], "--port: must be an integer in [0, 65535], got 70000"),
    (["{ckpt}", "--port", "http"], "integer"),
    (["{ckpt}", "--speed-limit", "0"], "> 0"),
    (["{ckpt}", "--speed-limit", "nan"], "> 0"),
    (["{ckpt}", "--extra-latency-ms", "-5"], "--extra-latency-ms must be in [0, 10000]"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, checkpoint, argv, words):
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    paths = {"missing": tmp_path / "missing.pt", "garbage": tmp_path / "garbage.pt", "ckpt": checkpoint,
             "discrete": constant_policy_checkpoint(tmp_path / "d.pt", action_space="discrete")}
    argv = [a.format(**paths) for a in argv]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(ub.main(argv))
    assert e.value.code == 2
    assert words in _one_line_error(capsys)


def test_without_a_checkpoint_the_shipped_real_frame_student_drives():
    """No CKPT is the common case (a person's simulator): the student made for real frames, which exists."""
    from policies.checkpoint import RECORDING_STUDENT
    from common.cli import parse

    args = parse(ub.BridgeArgs, [], prog="bridge")
    assert args.checkpoint == RECORDING_STUDENT
    ub.load_policy(args.checkpoint)


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        ub.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "4567" in out and "127.0.0.1" in out and "25" in out and "Autonomous Mode" in out


@NEEDS_SOCKETIO
def test_cli_port_in_use(checkpoint, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert ub.main([str(checkpoint), "--port", str(port)]) == 2
    assert "already in use" in _one_line_error(capsys)


# ------------------------------------------------------------------------------- the protocol over a real socket
def _run_with_timeout(fn, timeout: float = TIMEOUT_S):
    """Run ``fn`` in a daemon thread; fail (never hang) if it takes longer than ``timeout``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"timed out after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@NEEDS_SOCKETIO
def test_protocol_over_socketio(checkpoint):
    import socketio

    steering = ub.SteeringServer(load_checkpoint(checkpoint))
    bridge = ub.Bridge(steering, "127.0.0.1", 0)  # a free port, loopback only
    assert bridge.host == "127.0.0.1" and bridge.port > 0
    server = threading.Thread(target=bridge.serve_forever, daemon=True)
    server.start()
    frames = _frames(3)
    reference = load_checkpoint(checkpoint).stream()
    first_expected = float(reference.step(ub.decode_image(_jpeg_b64(frames[0]))[0], 0.0)[0])

    def drive_once() -> tuple[dict, list[dict], dict]:
        events: queue.Queue = queue.Queue()
        client = socketio.Client(reconnection=False)
        client.on("steer", lambda data: events.put(("steer", data)))
        client.on("manual", lambda data: events.put(("manual", data)))
        client.connect(f"http://127.0.0.1:{bridge.port}", transports=["websocket"])
        try:
            hello = events.get(timeout=TIMEOUT_S / 2)
            replies = []
            for f in frames:
                client.emit("telemetry", _telemetry(f, speed=5.0))
                replies.append(events.get(timeout=TIMEOUT_S / 2))
            client.emit("telemetry", {})
            manual = events.get(timeout=TIMEOUT_S / 2)
        finally:
            client.disconnect()
        return hello, replies, manual

    try:
        for _ in range(2):  # a second connection starts a fresh stream
            hello, replies, manual = _run_with_timeout(drive_once)
            assert hello == ("steer", {"steering_angle": "0", "throttle": "0"})
            assert [kind for kind, _ in replies] == ["steer"] * 3
            for _, data in replies:
                assert set(data) == {"steering_angle", "throttle"} and all(isinstance(v, str) for v in data.values())
                s = float(data["steering_angle"])
                assert -1 <= s <= 1 and math.isclose(float(data["throttle"]), 1 - s * s - 0.04, abs_tol=1e-9)
            assert float(replies[0][1]["steering_angle"]) == pytest.approx(first_expected, abs=1e-6)
            assert manual == ("manual", {})
    finally:
        bridge.stop()
        server.join(TIMEOUT_S)
    assert not server.is_alive(), "the bridge did not stop"
    assert steering.frames == 6 and steering.manual == 2 and steering.errors == 0
    with pytest.raises(OSError):  # the listening socket is closed
        socket.create_connection(("127.0.0.1", bridge.port), timeout=1).close()


def test_a_latency_aware_policy_is_told_the_measured_answer_time(monkeypatch):
    from tests.helpers import record_told_latency

    told = record_told_latency(monkeypatch)
    server = ub.SteeringServer(_udacity_policy(latency_input="input"), clock=_Clock(), extra_latency_s=0.05)
    for frame in _frames(4):
        server.on_telemetry(_telemetry(frame))
    assert told[0] == pytest.approx(0.05)  # nothing measured yet: the extra alone
    measured = sorted(server.latencies_ms[:3])[1] / 1e3  # the median of the three answers before the fourth
    assert told[3] == pytest.approx(measured + 0.05)
    assert server.told_latency() == pytest.approx(np.median(server.latencies_ms) / 1e3 + 0.05)


def test_frames_of_another_size_are_stopped_not_resized(checkpoint, caplog):
    """The one rule for frames (policies.frames.check_frame_shape): a policy trained on the simulator's 160x320 frames
    never drives 480x640 ones; each is answered with a stop, said once, counted in the summary."""
    server = ub.SteeringServer(load_checkpoint(checkpoint), clock=_Clock())
    big = cv2.resize(_frames(1)[0], (640, 480))
    with caplog.at_level(logging.ERROR, logger="agent.udacity.bridge"):
        replies = [server.on_telemetry(_telemetry(big)) for _ in range(3)]
    assert replies == [{"steering_angle": "0.0", "throttle": "0.0"}] * 3 and server.frames == 0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("telemetry frames are 480x640x3, and the policy was trained on "
                                                 "160x320x3 frames"), said
    assert "3 of another size (stopped)" in server.summary()
    assert server.on_telemetry(_telemetry(_frames(1)[0])) != ub.STOP, "the simulator's own frames are driven"
    # a student trained on other frames (its checkpoint says which) is stopped on the simulator's
    other = ub.SteeringServer(_udacity_policy(frame_shape=[480, 640, 3]))
    assert other.on_telemetry(_telemetry(_frames(1)[0])) == ub.STOP
    assert other.on_telemetry(_telemetry(big)) != ub.STOP


# ------------------------------------------------------------------------------- the bridge as a process
def _serve(argv, stop):
    proc = subprocess.Popen([sys.executable, "-m", "agent.udacity.bridge", *argv, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving"), proc.communicate(timeout=30)
        time.sleep(0.3)
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, first + out, err


@NEEDS_SOCKETIO
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_bridge_prints_its_summary(stop, checkpoint):
    rc, out, err = _serve([str(checkpoint)], stop)
    assert rc == 0 and "served 0 frames" in out and "Traceback" not in err, (out, err)
    assert "with 1 torch thread(s)" in out


@NEEDS_SOCKETIO
def test_threads_flag(checkpoint, capsys):
    rc, out, _ = _serve([str(checkpoint), "--threads", "2"], signal.SIGTERM)
    assert rc == 0 and "with 2 torch thread(s)" in out
    with pytest.raises(SystemExit) as e:
        ub.main([str(checkpoint), "--threads", "0"])
    assert e.value.code == 2 and "--threads: must be an integer >= 1, got 0" in capsys.readouterr().err
