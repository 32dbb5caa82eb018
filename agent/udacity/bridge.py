"""Drive the real Udacity simulator with a trained policy: the simulator's socket.io protocol on port 4567.

    pip install -e '.[bridge]'                                   # python-socketio 4.x + eventlet
    python -m agent.udacity.bridge runs/train/nac/best.pt        # serving ... on http://127.0.0.1:4567
    python -m agent.udacity.bridge best.pt --record out/drive1   # also keep the frames it drove on

Why: the project's own ``UdacityStyle-v0`` imitates the simulator; this bridge lets a policy trained
here (on it, or on recordings imported with ``agent.udacity.recordings``) drive the real Unity program.

With the real simulator: start the bridge first, then the simulator; pick a track and press
**Autonomous Mode**. The simulator connects by itself to ``ws://127.0.0.1:4567`` (its port is fixed,
so ``--port`` only helps forks and tests); when the bridge runs inside a VM, WSL or a container,
forward port 4567 and start it with ``--host 0.0.0.0`` (it binds 127.0.0.1 unless asked). The car
moves as soon as the first steer answer arrives; Ctrl-C (or SIGTERM) stops the bridge and prints a summary.
The policy runs on one torch thread (``--threads``): a single frame gains nothing from more, and on a busy CPU
extra threads wait on each other, which the simulator sees as a lower frame rate.

Protocol (one socket.io connection, the simulator is the client)::

    simulator -> telemetry {steering_angle, throttle, speed (mph), image (base64 JPEG, 320x160 RGB)}
    bridge    -> steer {steering_angle: str, throttle: str}    one answer per telemetry frame
    bridge    -> manual {}                                    when the telemetry payload is empty
    bridge    -> steer {"0", "0"}                             once, on connect

The simulator sends its next telemetry in answer to each steer or manual message, so every telemetry
gets exactly one answer (a frame the bridge cannot read, or of another size than the policy was trained
on, is logged and answered with steering 0, throttle 0), and the frame rate is bounded by the bridge's latency. Manual
mode is the user holding a drive key: the payload is then empty. Steering and throttle are sent as **strings**
(``str(float)``; the simulator reads the JSON fields as text and parses them). Steering is
the policy's steering in [-1, 1] (+-25 degrees, + = right: the simulator's own convention, the same
as this project's, times the checkpoint's ``steer_gain`` where set); throttle follows the usual drive loop,
``1 - steering^2 - (speed / limit)^2`` clipped to [0, 1], unless the checkpoint drives with a fixed throttle
(``fixed_throttle``: ``train.py --preset paper-udacity`` stores the authors' 0.05). Each frame is one
``PolicyStream.step(frame, t)`` with ``t`` the seconds since the connection's first frame (monotonic clock), so
time-aware cores see the real frame spacing; the stream is reset on every new connection. ``SteeringServer`` holds all
of that without a socket (it is what the tests drive); ``Bridge`` only moves its dicts over socket.io.

Library versions. The official simulator builds (udacity/self-driving-car-sim, 2017) use an old
Unity socket.io client that speaks Socket.IO protocol 4 over Engine.IO 3 (although its URL says
``EIO=4``): it needs **python-socketio 4.x with python-engineio 3.x** (4.6.x with 3.13/3.14 is the
pair people report working; with 5.x the simulator connects and the car never moves). Forks rebuilt
with a current Socket.IO client (3.x/4.x JavaScript era) need python-socketio 5.x; this module runs
unchanged on both (its tests pass on 4.6.1 + 3.14.2 and on 5.18 + 4.15, against python-socketio's
own client, not against the Unity program). The ``bridge`` extra pins the 4.x pair. The server runs
on eventlet's WSGI server: python-socketio 4.x's asyncio server fails on Python >= 3.11 and its
threading mode has no websocket transport (the simulator uses only websockets), and eventlet serves
websockets on 4.x and 5.x alike (it is also what Udacity's own drive.py used). Eventlet is in
bugfix-only mode and says so at import; that notice is silenced here. python-engineio 3.x is no
longer maintained: keep the bridge on 127.0.0.1 unless the simulator is elsewhere on a trusted
network.

``--record DIR`` keeps what the policy saw in the simulator's own format: ``IMG/center_<time>.jpg``
(the received JPEG bytes as they are) and ``driving_log.csv`` rows ``center, , , steering, throttle,
0, speed`` (left and right empty: the simulator sends the center camera only); ``python -m
agent.udacity.recordings import`` and ``train.py --data`` read it as a center-camera recording.
"""
from __future__ import annotations

import base64
import binascii
import csv
import errno
import logging
import socket
import statistics
import sys
import threading
import textwrap
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import cv2
import numpy as np
import torch

from common.cli import integer, option, port, positive, run_command
from policies.checkpoint import RECORDING_STUDENT, load_checkpoint
from policies.policy import WINDOW_CLOCKS, DrivingPolicy

log = logging.getLogger(__name__)


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4567  # the simulator always connects here
DEFAULT_SPEED_LIMIT = 25.0  # mph, as the usual drive.py
UDACITY_ENV = "UdacityStyle-v0"
FRAME_SHAPE = (160, 320, 3)  # the simulator's center camera, rows x columns x RGB
STOP = {"steering_angle": "0.0", "throttle": "0.0"}  # the answer to a frame the bridge cannot read
INSTALL_HINT = "pip install -e '.[bridge]' (python-socketio 4.x, python-engineio 3.x, eventlet)"
MAX_LOGGED_ERRORS = 10  # a simulator sending garbage 30 times a second should not flood the terminal


def throttle_for(steering: float, speed_mph: float, speed_limit: float = DEFAULT_SPEED_LIMIT) -> float:
    """The usual drive loop's throttle: slow down in bends and near the limit, never outside [0, 1]."""
    return float(np.clip(1.0 - steering ** 2 - (speed_mph / speed_limit) ** 2, 0.0, 1.0))


def decode_image(text: str) -> tuple[np.ndarray, bytes]:
    """The telemetry's base64 JPEG -> (RGB uint8 ``[H, W, 3]``, the JPEG bytes); ValueError saying what is wrong."""
    if not isinstance(text, (str, bytes)) or not text:
        raise ValueError(f"image must be a non-empty base64 string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"image is not valid base64 ({e})") from None
    bgr = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR) if raw else None
    if bgr is None:
        raise ValueError(f"image is not a decodable JPEG ({len(raw)} bytes)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), raw  # OpenCV decodes to BGR; the policy was trained on RGB


def check_policy(policy: DrivingPolicy, where: str = "checkpoint") -> int:
    """The index of the steering output; ValueError when the policy cannot steer the simulator."""
    c = policy.config
    if c.head != "continuous":
        raise ValueError(f"{where} has a {c.head!r} head; the simulator needs a continuous steering policy "
                         f"(train one with train.py --env udacity)")
    if "steer" not in c.action_names:
        raise ValueError(f"{where} outputs {c.action_names} and no 'steer'; the simulator needs steering")
    if c.queue_steps:
        raise ValueError(f"{where} is shown its actions on their way (train.py --latency-queue), which the bridge "
                         "cannot see: the simulator does not say which of its answers it has applied")
    return c.action_names.index("steer")


def load_policy(path: str | Path) -> DrivingPolicy:
    """Load a train.py checkpoint and check it steers (clear FileNotFoundError / ValueError otherwise)."""
    policy = load_checkpoint(path)
    check_policy(policy, f"checkpoint {str(path)!r}")
    return policy


class Recorder:
    """Appends frames to a recording in the simulator's format (IMG/ + header-less driving_log.csv)."""

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ValueError(f"--record {str(self.out_dir)!r} exists and is not a folder")
        self.img_dir = self.out_dir / "IMG"
        self.img_dir.mkdir(parents=True, exist_ok=True)
        self._csv = open(self.out_dir / "driving_log.csv", "a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._csv, lineterminator="\n")
        self._last: datetime | None = None
        self.frames = 0

    def _stamp(self) -> datetime:
        """Local wall-clock time to the millisecond, strictly increasing so no two frames share a file name."""
        now = datetime.now()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        if self._last is not None and now <= self._last:
            now = self._last + timedelta(milliseconds=1)
        self._last = now
        return now

    def add(self, jpeg: bytes, steering: float, throttle: float, speed_mph: float) -> Path:
        t = self._stamp()
        path = (self.img_dir / f"center_{t:%Y_%m_%d_%H_%M_%S}_{t.microsecond // 1000:03d}.jpg").resolve()
        path.write_bytes(jpeg)
        self._writer.writerow([str(path), "", "", repr(steering), repr(throttle), "0", repr(speed_mph)])
        self._csv.flush()  # a Ctrl-C or a crash keeps every row written so far
        self.frames += 1
        return path

    def close(self) -> None:
        self._csv.close()


class SteeringServer:
    """The protocol's logic without a socket: ``on_telemetry(data)`` -> the steer dict, or None (manual mode)."""

    def __init__(self, policy: DrivingPolicy, speed_limit: float = DEFAULT_SPEED_LIMIT,
                 recorder: Recorder | None = None, clock: Callable[[], float] = time.monotonic,
                 window_clock: str = "time", extra_latency_s: float = 0.0):
        """``extra_latency_s``: the part of the frame-to-wheel time the bridge cannot see (the network, the
        simulator's own frame), added to its measured frame-to-answer time when it tells a latency-aware policy."""
        if not speed_limit > 0:
            raise ValueError(f"speed limit must be > 0 mph, got {speed_limit}")
        self.policy = policy
        self.steer_index = check_policy(policy)
        self.speed_limit = float(speed_limit)
        self.recorder = recorder
        self.clock = clock
        self.stream = policy.stream(window_clock)  # the simulator's frames arrive when it sends them, not on a clock
        self.frames = self.manual = self.errors = 0
        self.latencies_ms: list[float] = []
        self.extra_latency_s = float(extra_latency_s)
        self._t0: float | None = None
        # the frames it drives: the size it was trained on (a checkpoint that does not say: the simulator's camera)
        self.frame_shape = tuple(policy.config.frame_shape or FRAME_SHAPE)
        self.wrong_size = 0  # frames of another size, answered with a stop

    def reset(self) -> None:
        """A new connection: an empty frame window and a clock starting at its first frame."""
        self.stream.reset()
        self._t0 = None

    def on_telemetry(self, data: dict[str, Any] | None) -> dict[str, str] | None:
        """One telemetry payload -> ``{"steering_angle": str, "throttle": str}``; None for manual mode.

        A payload the bridge cannot read is logged and answered with steering 0, throttle 0 (never raises:
        an exception here would silently drop the simulator's frame inside the socket layer)."""
        if not data:
            self.manual += 1
            return None
        start = time.perf_counter()
        try:
            if not isinstance(data, dict):
                raise ValueError(f"telemetry must be a dict, got {type(data).__name__}")
            if "image" not in data or "speed" not in data:
                raise ValueError(f"telemetry lacks {sorted({'image', 'speed'} - set(data))} (got keys {sorted(data)})")
            try:
                speed = float(data["speed"])
            except (TypeError, ValueError):
                raise ValueError(f"speed {data['speed']!r} is not a number") from None
            frame, jpeg = decode_image(data["image"])
            if frame.shape != self.frame_shape:  # never cropped and resized into a view the policy never saw
                self.wrong_size += 1
                if self.wrong_size == 1:
                    log.error("telemetry frames are %s, and the policy was trained on %s frames: each such frame is "
                              "answered with steering 0, throttle 0 (a policy never drives frames of another size)",
                              "x".join(map(str, frame.shape)), "x".join(map(str, self.frame_shape)))
                return dict(STOP)
            now = self.clock()
            if self._t0 is None:
                self._t0 = now
            output = self.stream.step(frame, now - self._t0, self.told_latency())
            steering = float(self.policy.to_env_action(output)[self.steer_index])
        except Exception as e:  # noqa: BLE001 - reported, answered with a stop, counted
            self.errors += 1
            if self.errors <= MAX_LOGGED_ERRORS:
                log.error("bad telemetry frame (answered with steering 0, throttle 0): %s%s", e,
                          "; further bad frames are only counted" if self.errors == MAX_LOGGED_ERRORS else "")
            return dict(STOP)
        throttle = self.policy.throttle_for(throttle_for(steering, speed, self.speed_limit))  # or its fixed one
        if self.recorder is not None:
            try:
                self.recorder.add(jpeg, steering, throttle, speed)
            except OSError as e:  # a full disk stops the recording, not the car
                log.error("recording stopped: %s", e)
                self.recorder = None
        self.frames += 1
        self.latencies_ms.append((time.perf_counter() - start) * 1e3)
        return {"steering_angle": str(steering), "throttle": str(throttle)}

    def told_latency(self) -> float:
        """Seconds a latency-aware policy is told its answer takes to act: the median of the last 20 measured
        frame-to-answer times (decode, policy, throttle) plus the extra the bridge cannot see."""
        recent = self.latencies_ms[-20:]
        return (statistics.median(recent) / 1e3 if recent else 0.0) + self.extra_latency_s

    def summary(self) -> str:
        """One line for the end of a session."""
        if self.latencies_ms:
            lat = np.asarray(self.latencies_ms)
            timing = f", latency median {statistics.median(lat):.1f} ms (p95 {np.percentile(lat, 95):.1f} ms)"
        else:
            timing = ""
        extra = "".join([f", {self.manual} manual-mode" if self.manual else "",
                         f", {self.errors} unreadable" if self.errors else "",
                         f", {self.wrong_size} of another size (stopped)" if self.wrong_size else "",
                         f"; recorded {self.recorder.frames} to {self.recorder.out_dir}" if self.recorder else ""])
        return f"served {self.frames} frames{extra}{timing}"


def import_socketio() -> tuple[Any, Any]:
    """(socketio, eventlet), or RuntimeError with the install command."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eventlet's "deprecated, bugfix mode" notice at import
            import eventlet
            import eventlet.wsgi
            import socketio
    except ImportError as e:
        raise RuntimeError(f"the bridge needs python-socketio and eventlet ({e}); "
                           f"install them: {INSTALL_HINT}") from None
    return socketio, eventlet


class Bridge:
    """A socket.io server on eventlet's WSGI server that hands every telemetry to a ``SteeringServer``.

    One simulator at a time: the stream is shared, and each new connection resets it."""

    def __init__(self, steering: SteeringServer, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        socketio, self._eventlet = import_socketio()
        self.steering = steering
        self.clients: set[str] = set()
        self._stop = threading.Event()
        self.sio = socketio.Server(async_mode="eventlet", logger=False, engineio_logger=False)
        self.sio.on("connect", self._on_connect)
        self.sio.on("disconnect", self._on_disconnect)
        self.sio.on("telemetry", self._on_telemetry)
        self.app = socketio.WSGIApp(self.sio)
        self.sock = self._listen(host, port)
        self.host, self.port = host, int(self.sock.getsockname()[1])

    def _listen(self, host: str, port: int) -> Any:
        try:
            return self._eventlet.listen((host, port))
        except socket.gaierror:
            raise OSError(f"cannot resolve --host {host!r}") from None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise OSError(f"port {port} on {host} is already in use (another bridge or drive.py running? "
                              f"stop it, or pick another --port)") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise OSError(f"cannot listen on {host}: not an address of this machine") from None
            if e.errno == errno.EACCES:
                raise OSError(f"permission denied to listen on port {port} (ports "
                              "below 1024 need privileges)") from None
            raise OSError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # handlers: socket.io 5.x passes an auth argument to connect, 4.x does not
    def _on_connect(self, sid: str, environ: dict, auth: Any = None) -> None:
        self.clients.add(sid)
        self.steering.reset()
        log.info("simulator connected (%s)", environ.get("REMOTE_ADDR", "?"))
        self.sio.emit("steer", {"steering_angle": "0", "throttle": "0"}, to=sid)

    def _on_disconnect(self, sid: str) -> None:
        self.clients.discard(sid)
        log.info("simulator disconnected")

    def _on_telemetry(self, sid: str, data: Any = None) -> None:
        reply = self.steering.on_telemetry(data)
        if reply is None:
            self.sio.emit("manual", {}, to=sid)
        else:
            self.sio.emit("steer", reply, to=sid)

    def serve_forever(self) -> None:
        """Serve until ``stop()`` (from any thread) or Ctrl-C (re-raised); connections are closed on the way out."""
        eventlet = self._eventlet
        server = eventlet.spawn(eventlet.wsgi.server, self.sock, self.app, log_output=False)
        try:
            while not self._stop.is_set() and not server.dead:
                eventlet.sleep(0.05)
            if server.dead:
                server.wait()  # re-raises whatever ended the WSGI server early
        finally:
            for sid in list(self.clients):
                try:
                    self.sio.disconnect(sid)
                except Exception:  # noqa: BLE001 - best effort while shutting down
                    pass
            server.kill()  # GreenletExit in accept(); wsgi.server's own cleanup may still wait on a socket
            try:
                self.sock.close()
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()


@dataclass
class BridgeArgs:
    checkpoint: Path = option(RECORDING_STUDENT, "a continuous steering policy checkpoint (.pt "
                              "from train.py, e.g. runs/train/nac/best.pt; default: the student shipped for the real "
                              "simulator's frames, trained on many drivers' recordings)", group="model", metavar="CKPT",
                              positional=True)
    host: str = option(DEFAULT_HOST, "address to listen on; 0.0.0.0 listens on every interface (only when the "
                       "simulator runs on another machine or outside a VM/container)", group="runtime")
    port: int = option(DEFAULT_PORT, "port to listen on (the simulator always connects to 4567; 0 picks a free one)",
                       group="runtime", parse=port)
    speed_limit: float = option(DEFAULT_SPEED_LIMIT, "speed at which the throttle reaches 0 on a straight",
                                group="what drives", metavar="MPH", parse=positive)
    window_clock: str = option("time", "how the policy picks its window from the frames received: time (the newest "
                               "frames at or before the trained offsets in seconds: the simulator's frame rate "
                               "varies) | steps (the last frames, every frame_stride-th)", group="model",
                               choices=WINDOW_CLOCKS)
    threads: int = option(1, "torch threads for the policy, which steps one frame at a time", group="runtime",
                          metavar="N", parse=integer(1))
    extra_latency_ms: float = option(0.0, "milliseconds of the frame-to-wheel time the bridge cannot measure (network, "
                                     "the simulator's frame and actuation), added to its measured frame-to-answer "
                                     "time when it tells a latency-aware student (train.py --latency-input) when its "
                                     "answer lands", group="model", metavar="MS")
    record: Path | None = option(None, "also save the received frames as a simulator recording in DIR (IMG/ + "
                                 "driving_log.csv, appended if it exists; steering column = the policy's); default: "
                                 "no recording", group="output", metavar="DIR")


_HELP = (textwrap.fill("Let a trained policy drive the real Udacity simulator: serve its socket.io protocol (telemetry "
                       "in, steer out), one policy stream step per frame. Start this, then the simulator, pick a track "
                       "and press Autonomous Mode. Needs: " + INSTALL_HINT + ".", 110) + "\n\n" +
         textwrap.fill("throttle = clip(1 - steering^2 - (speed / speed-limit)^2, 0, 1); steering and throttle are "
                       "sent as strings. Ctrl-C or SIGTERM stops and prints frames served and the median latency.",
                       110))


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM stops as Ctrl-C does: with the summary
    return run_command(BridgeArgs, serve, argv, prog="python -m agent.udacity.bridge", doc=_HELP,
                       mistakes=(ValueError, OSError, RuntimeError))


def serve(args: BridgeArgs) -> None:
    """Serve ``args.checkpoint`` to the simulator until Ctrl-C (the way a server is stopped), then print the frames
    served and the median latency."""
    if not log.handlers:  # our messages only: a root handler would also print socket.io's per-packet INFO lines
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    if not 0 <= args.extra_latency_ms <= 10_000:
        raise ValueError(f"--extra-latency-ms must be in [0, 10000], got {args.extra_latency_ms}")
    import_socketio()
    policy = load_policy(args.checkpoint)
    if policy.config.env != UDACITY_ENV:
        print(f"warning: {args.checkpoint} was trained on {policy.config.env} frames, not {UDACITY_ENV}; "
              f"its steering may mean little in the simulator", file=sys.stderr)
    steering = SteeringServer(policy, args.speed_limit, window_clock=args.window_clock,
                              extra_latency_s=args.extra_latency_ms / 1e3)
    bridge = Bridge(steering, args.host, args.port)
    recorder = None if args.record is None else Recorder(args.record)
    steering.recorder = recorder
    torch.set_num_threads(args.threads)
    print(f"serving {args.checkpoint} on {bridge.url} with {args.threads} torch thread(s) (Ctrl-C to stop)", flush=True)
    try:
        bridge.serve_forever()
    except KeyboardInterrupt:  # how a server is stopped: the summary follows
        pass
    finally:
        if recorder is not None:
            recorder.close()
    print(steering.summary())


if __name__ == "__main__":
    raise SystemExit(main())
