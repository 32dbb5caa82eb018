"""Procedural closed tracks for the Udacity-style simulator, one per (theme, integer seed).

Why procedural: the real Udacity tracks (Unity scenes) cannot be shipped here, and an unlimited supply
of distinct tracks lets evaluation use tracks never seen in training.

Construction (`generate_track`): K control points at sorted, jittered angles around the origin with
random radii, joined by a *periodic uniform cubic B-spline* (C2: curvature is continuous, so the
steering a track asks for has no jumps), scaled to a random length, resampled at a fixed arc-length
spacing of about 0.5 m. A draw whose sharpest bend is tighter than the theme's minimum radius is
pulled towards a circle (control radii shrunk towards their mean) until it is not; a draw where two
stretches of road come closer than c = road width + 6 m (verges, scenery) is thrown away and redrawn;
that also rules out self-intersection (see generate_track).
Every random number comes from one generator seeded with (seed, theme), so a seed always builds the
same track. Half the seeds are driven clockwise so right- and left-hand bends are equally common.

Units and conventions (used by the whole package): metres; the world frame has x east, y north;
`headings` are counter-clockwise from +x in radians (the direction of travel); curvature and lateral
offsets are positive to the RIGHT of the direction of travel (a right-hand bend has curvature > 0, a
car right of the centreline has lateral offset > 0), the same sense as a positive steering command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

THEMES = ("lake", "jungle", "mountain")
CLASSIC_THEMES = ("lake", "jungle")  # the themes of UdacityStyle-v0 (the "classic" world)
WORLDS = ("classic", "hard")  # generate_track(world=...): v0's flat loops, or v1's hills and hairpins
SPACING_M = 0.5  # target arc-length spacing of the resampled centreline
_SCENERY_GAP_M = 6.0  # extra clearance between two stretches of road (verges, trees) beyond the road width
_DENSE_PER_SPAN = 96  # spline samples per control span when measuring arc length and curvature
_MAX_DRAWS = 200  # redraws allowed before giving up (never reached in practice: see tests)
_WALK_LIMIT = 80  # points (40 m) project() may walk from its hint before falling back to a global search


@dataclass(frozen=True)
class ThemeTrackParams:
    """Shape parameters of one theme's tracks (lengths in metres)."""

    road_width: float  # edge line to edge line
    min_radius: float  # tightest allowed radius of curvature of the centreline
    length_range: tuple[float, float]  # total centreline length is drawn uniformly from this range
    n_controls: tuple[int, int]  # number of spline control points, inclusive range
    radius_jitter: float  # control radii are 1 ± this (relative), before smoothing
    angle_jitter: float  # control angles move by ± this fraction of their even spacing


TRACK_PARAMS: dict[str, ThemeTrackParams] = {
    # Lake: a wide road and long sweeping bends (like Udacity's first track).
    "lake": ThemeTrackParams(10.0, 35.0, (600.0, 900.0), (7, 10), 0.28, 0.30),
    # Jungle: a narrow road, many control points and large radius swings give hairpins and S-bends.
    "jungle": ThemeTrackParams(7.0, 12.0, (500.0, 800.0), (12, 16), 0.45, 0.35),
    # Mountain (classic world only as a flat stand-in): narrow, the tightest bends.
    "mountain": ThemeTrackParams(6.0, 9.0, (500.0, 800.0), (13, 17), 0.50, 0.35),
}

# The hard world (UdacityStyle-v1): tighter bends and more of them, and elevation.
HARD_TRACK_PARAMS: dict[str, ThemeTrackParams] = {
    "lake": ThemeTrackParams(9.0, 18.0, (600.0, 900.0), (9, 12), 0.40, 0.35),
    "jungle": ThemeTrackParams(7.0, 8.0, (500.0, 800.0), (13, 17), 0.50, 0.35),
    "mountain": ThemeTrackParams(6.0, 7.0, (500.0, 800.0), (14, 18), 0.55, 0.35),
}


# hard world: hairpin inlets per track, [low, high); every mountain track has at least one hairpin (redrawn until)
HAIRPINS = {"lake": (0, 2), "jungle": (1, 3), "mountain": (2, 4)}


@dataclass(frozen=True)
class ElevationParams:
    """Hills of one theme in the hard world: a periodic sum of harmonics of the lap, scaled to a peak-to-peak
    height and capped at a maximum grade (rise per metre along the road)."""

    relief: tuple[float, float]  # peak-to-peak height (m), drawn uniformly from this range
    max_grade: float
    harmonics: tuple[int, int]  # the lap's harmonics used, inclusive range (more = more, shorter hills)


ELEVATION: dict[str, ElevationParams] = {
    "lake": ElevationParams((3.0, 6.0), 0.06, (1, 4)),
    "jungle": ElevationParams((5.0, 10.0), 0.09, (2, 5)),
    "mountain": ElevationParams((10.0, 20.0), 0.12, (1, 4)),
}


def check_theme(theme: str) -> str:
    """Return `theme` if it is a known theme, else raise a ValueError naming the valid ones."""
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {THEMES}, got {theme!r}")
    return theme


def check_seed(seed: object, name: str = "seed") -> int:
    """Return `seed` as an int if it is a non-negative integer (bools rejected), else raise."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{name} must be a non-negative int, got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"{name} must be a non-negative int, got {seed!r}")
    return int(seed)


def _wrap(angle: float) -> float:
    """Wrap an angle to [-pi, pi)."""
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


@dataclass(eq=False)
class Track:
    """A closed centreline sampled at uniform arc length, with its road width.

    Arrays (length N, index i is the point at arc length s[i] = i * ds): `points` [N, 2], `headings`,
    `curvature` (+ = right-hand bend, 1/m), `s`. The point after N-1 is point 0 again.
    """

    points: np.ndarray
    headings: np.ndarray
    curvature: np.ndarray
    road_width: float
    theme: str = "custom"
    seed: int = -1
    elevation: np.ndarray | None = None  # [N] road height (m) at each point; None = flat (all zeros)
    s: np.ndarray = field(init=False)
    length: float = field(init=False)
    ds: float = field(init=False)

    def __post_init__(self) -> None:
        pts = np.ascontiguousarray(self.points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 8:
            raise ValueError(f"points must be an [N>=8, 2] array, got shape {pts.shape}")
        if self.road_width <= 0:
            raise ValueError(f"road_width must be > 0, got {self.road_width!r}")
        self.points = pts
        self.headings = np.asarray(self.headings, dtype=np.float64)
        self.curvature = np.asarray(self.curvature, dtype=np.float64)
        n = len(pts)
        seg = np.roll(pts, -1, axis=0) - pts
        self.seg_len = np.hypot(seg[:, 0], seg[:, 1])
        self.length = float(self.seg_len.sum())
        self.ds = self.length / n
        self.s = np.arange(n) * self.ds
        self.n = n
        # Python lists: scalar reads from them are several times faster than numpy scalar indexing,
        # which matters in project(), called once per env step.
        self._x = pts[:, 0].tolist()
        self._y = pts[:, 1].tolist()
        self._h = self.headings.tolist()
        self._seg_dx = seg[:, 0].tolist()
        self._seg_dy = seg[:, 1].tolist()
        self._seg_len = self.seg_len.tolist()
        if self.elevation is None:
            self.elevation = np.zeros(n)
        self.elevation = np.asarray(self.elevation, dtype=np.float64)
        if self.elevation.shape != (n,):
            raise ValueError(f"elevation must have shape ({n},), got {self.elevation.shape}")
        # grade[i]: rise per metre from point i to i+1 (+ = uphill in the direction of travel)
        self.grade = (np.roll(self.elevation, -1) - self.elevation) / self.seg_len
        self._z = self.elevation.tolist()
        self._grade = self.grade.tolist()
        self.hilly = bool(np.any(self.elevation != 0.0))

    @property
    def half_width(self) -> float:
        return 0.5 * self.road_width

    @classmethod
    def from_points(cls, points: np.ndarray, road_width: float, *, theme: str = "custom", seed: int = -1) -> Track:
        """A track through a closed polyline (any spacing); headings and curvature by finite differences.

        For tests and hand-made layouts; `generate_track` gives exact spline headings and curvature.
        """
        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 8:
            raise ValueError(f"points must be an [N>=8, 2] array, got shape {pts.shape}")
        nxt, prv = np.roll(pts, -1, axis=0), np.roll(pts, 1, axis=0)
        d = nxt - prv
        headings = np.arctan2(d[:, 1], d[:, 0])
        dh = (np.roll(headings, -1) - np.roll(headings, 1) + np.pi) % (2 * np.pi) - np.pi
        arc = np.hypot(*(nxt - pts).T) + np.hypot(*(pts - prv).T)
        return cls(pts, headings, -dh / arc, road_width, theme, seed)

    def project(self, x: float, y: float, hint: int | None = None) -> tuple[float, float, int]:
        """Closest centreline position to (x, y): (arc length s in [0, length), signed lateral offset, index).

        The offset is + when (x, y) is RIGHT of the direction of travel. `index` is the centreline point
        at or just behind s; pass it back as `hint` next time. With a hint the search walks from it
        along the centreline while the distance shrinks (a car moves a few points per step: ~1 us in
        plain Python, several times cheaper than any numpy call); that finds the true closest point
        whenever (x, y) is closer to the centreline than its tightest radius of curvature (always, on
        or near the road). Without a hint, or if the walk runs more than 40 m, a vectorised search over
        all points is used.
        """
        n, xs, ys = self.n, self._x, self._y
        i = -1
        if hint is not None:
            i = int(hint) % n
            dx, dy = x - xs[i], y - ys[i]
            d = dx * dx + dy * dy
            for step in (1, -1):
                moved = False
                for _ in range(_WALK_LIMIT):
                    j = (i + step) % n
                    dx, dy = x - xs[j], y - ys[j]
                    dj = dx * dx + dy * dy
                    if dj >= d:
                        break
                    i, d, moved = j, dj, True
                else:
                    i = -1  # walked too far: the hint was stale
                    break
                if moved:
                    break
        if i < 0:
            dxa = self.points[:, 0] - x
            dya = self.points[:, 1] - y
            i = int(np.argmin(dxa * dxa + dya * dya))
        # Refine on the segment after i, or the one before if the foot of the perpendicular is behind i.
        px, py = x - xs[i], y - ys[i]
        sdx, sdy, sl = self._seg_dx[i], self._seg_dy[i], self._seg_len[i]
        t = (px * sdx + py * sdy) / (sl * sl)
        if t < 0.0:
            i = (i - 1) % n
            px, py = x - xs[i], y - ys[i]
            sdx, sdy, sl = self._seg_dx[i], self._seg_dy[i], self._seg_len[i]
            t = (px * sdx + py * sdy) / (sl * sl)
        t = 0.0 if t < 0.0 else 1.0 if t > 1.0 else t
        lateral = (px * sdy - py * sdx) / sl  # cross product with the segment direction: + = right
        s = (i + t) * self.ds
        if s >= self.length:
            s -= self.length
        return s, lateral, i

    def heading_at(self, s: float) -> float:
        """Direction of travel at arc length s (radians, counter-clockwise from +x), interpolated."""
        u = (s % self.length) / self.ds
        i = int(u) % self.n
        f = u - int(u)
        h0 = self._h[i]
        return h0 + f * _wrap(self._h[(i + 1) % self.n] - h0)

    def pose_at(self, s: float) -> tuple[float, float, float]:
        """(x, y, heading) of the centreline at arc length s (any real s; wraps around the loop)."""
        u = (s % self.length) / self.ds
        i = int(u) % self.n
        f = u - int(u)
        j = (i + 1) % self.n
        x = self._x[i] + f * (self._x[j] - self._x[i])
        y = self._y[i] + f * (self._y[j] - self._y[i])
        return x, y, self.heading_at(s)

    def elevation_at(self, s: float) -> float:
        """Road height (m) at arc length s, interpolated (0 on a flat track)."""
        u = (s % self.length) / self.ds
        i = int(u) % self.n
        f = u - int(u)
        return (1 - f) * self._z[i] + f * self._z[(i + 1) % self.n]

    def grade_at(self, s: float) -> float:
        """Grade (rise per metre, + = uphill in the direction of travel) of the segment at arc length s."""
        return self._grade[int((s % self.length) / self.ds) % self.n]

    def hairpins(self, turn_deg: float = 150.0, within_m: float = 50.0) -> int:
        """Number of separate bends that turn the road by at least `turn_deg` within `within_m` of road."""
        k = max(1, int(round(within_m / self.ds)))
        turn = np.abs(np.convolve(np.concatenate([self.curvature, self.curvature[:k]]), np.ones(k), "valid")[: self.n])
        hit = turn * self.ds >= math.radians(turn_deg)
        if hit.all():
            return 1
        # count runs of consecutive hits around the loop
        return int(np.sum(hit & ~np.roll(hit, 1)))

    def curvature_at(self, s: float) -> float:
        """Signed curvature (+ = right-hand bend, 1/m) at arc length s, interpolated."""
        u = (s % self.length) / self.ds
        i = int(u) % self.n
        f = u - int(u)
        return float((1 - f) * self.curvature[i] + f * self.curvature[(i + 1) % self.n])

    def offset_points(self, lateral: float) -> np.ndarray:
        """The polyline at a constant signed lateral offset (+ = right) from the centreline, [N, 2]."""
        h = self.headings
        right = np.stack([np.sin(h), -np.cos(h)], axis=1)
        return self.points + lateral * right

    def min_clearance(self, exclude_arc: float) -> float:
        """Smallest distance between two centreline points more than `exclude_arc` metres apart along the loop."""
        step = max(1, int(round(2.0 / self.ds)))  # every ~2 m is enough for the check
        idx = np.arange(0, self.n, step)
        p = self.points[idx]
        d = np.hypot(p[:, None, 0] - p[None, :, 0], p[:, None, 1] - p[None, :, 1])
        sep = np.abs(self.s[idx][:, None] - self.s[idx][None, :])
        sep = np.minimum(sep, self.length - sep)
        d[sep <= exclude_arc] = np.inf
        return float(d.min())

    def self_intersects(self, step: int = 1) -> bool:
        """True if any two non-adjacent segments of the centreline polyline (every `step`-th point) cross."""
        a = self.points[::step]
        b = np.roll(a, -1, axis=0)
        n = len(a)
        ii, jj = np.triu_indices(n, k=2)
        keep = ~((ii == 0) & (jj == n - 1))  # first and last segments share point 0
        ii, jj = ii[keep], jj[keep]
        # Coarse reject by bounding boxes first, then the orientation test on the survivors.
        lo_a, hi_a = np.minimum(a, b), np.maximum(a, b)
        ov = (
            (lo_a[ii, 0] <= hi_a[jj, 0]) & (lo_a[jj, 0] <= hi_a[ii, 0])
            & (lo_a[ii, 1] <= hi_a[jj, 1]) & (lo_a[jj, 1] <= hi_a[ii, 1])
        )
        ii, jj = ii[ov], jj[ov]

        def orient(p, q, r):
            return np.sign((q[:, 0] - p[:, 0]) * (r[:, 1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (r[:, 0] - p[:, 0]))

        o1 = orient(a[ii], b[ii], a[jj])
        o2 = orient(a[ii], b[ii], b[jj])
        o3 = orient(a[jj], b[jj], a[ii])
        o4 = orient(a[jj], b[jj], b[ii])
        return bool(np.any((o1 * o2 < 0) & (o3 * o4 < 0)))


# --- periodic uniform cubic B-spline ------------------------------------------------------------


def _bspline(ctrl: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point, first and second derivative (w.r.t. u) of the periodic cubic B-spline at u in [0, K)."""
    k = len(ctrl)
    j = np.floor(u).astype(np.int64)
    t = (u - j)[:, None]
    p0, p1, p2, p3 = (ctrl[(j + m) % k] for m in (-1, 0, 1, 2))
    t2, t3 = t * t, t * t * t
    pos = ((1 - t) ** 3 * p0 + (3 * t3 - 6 * t2 + 4) * p1 + (-3 * t3 + 3 * t2 + 3 * t + 1) * p2 + t3 * p3) / 6.0
    d1 = (-3 * (1 - t) ** 2 * p0 + (9 * t2 - 12 * t) * p1 + (-9 * t2 + 6 * t + 3) * p2 + 3 * t2 * p3) / 6.0
    d2 = (6 * (1 - t) * p0 + (18 * t - 12) * p1 + (-18 * t + 6) * p2 + 6 * t * p3) / 6.0
    return pos, d1, d2


def _signed_curvature(d1: np.ndarray, d2: np.ndarray) -> np.ndarray:
    """Curvature, + = right-hand bend (clockwise turning), of a curve with derivatives d1, d2."""
    cross = d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0]
    return -cross / np.hypot(d1[:, 0], d1[:, 1]) ** 3


def _spline_track(ctrl: np.ndarray, road_width: float, theme: str, seed: int) -> Track:
    """Resample the spline through `ctrl` at uniform arc length (~SPACING_M) and build the Track."""
    k = len(ctrl)
    u = np.arange(k * _DENSE_PER_SPAN) / _DENSE_PER_SPAN
    pos, _, _ = _bspline(ctrl, u)
    seg = np.hypot(*(np.roll(pos, -1, axis=0) - pos).T)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    length = cum[-1]
    n = int(round(length / SPACING_M))
    s = np.arange(n) * (length / n)
    u_s = np.interp(s, cum, np.append(u, float(k)))
    pos, d1, d2 = _bspline(ctrl, u_s)
    return Track(pos, np.arctan2(d1[:, 1], d1[:, 0]), _signed_curvature(d1, d2), road_width, theme, seed)


def check_world(world: str) -> str:
    if world not in WORLDS:
        raise ValueError(f"world must be one of {WORLDS}, got {world!r}")
    return world


def _elevation(track: Track, rng: np.random.Generator) -> np.ndarray:
    """Hills along the loop (ElevationParams of the track's theme): periodic, so the lap closes at its start height."""
    e = ELEVATION[track.theme]
    ks = np.arange(e.harmonics[0], e.harmonics[1] + 1)
    phase = 2 * np.pi * track.s / track.length
    amp = rng.uniform(0.3, 1.0, len(ks)) / ks**0.5
    z = (amp[:, None] * np.sin(ks[:, None] * phase[None, :] + rng.uniform(0, 2 * np.pi, len(ks))[:, None])).sum(0)
    z *= rng.uniform(*e.relief) / max(z.max() - z.min(), 1e-9)
    grade = np.abs(np.roll(z, -1) - z) / track.seg_len
    if grade.max() > e.max_grade:
        z *= e.max_grade / grade.max()
    return z - z[0]  # the start line is at height 0


def _fit_controls(angles: np.ndarray, radii: np.ndarray, length: float, min_radius: float,
                  clockwise: bool) -> np.ndarray | None:
    """Control points (m) whose spline is `length` long with no bend tighter than `min_radius`: the radii are
    pulled towards a circle (keeping the shape's character) until it holds; None if 40 pulls are not enough."""
    u = np.arange(len(angles) * _DENSE_PER_SPAN) / _DENSE_PER_SPAN
    for _shrink in range(40):
        ctrl = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
        if clockwise:
            ctrl = ctrl[::-1].copy()
        pos, d1, d2 = _bspline(ctrl, u)
        dense_len = float(np.hypot(*(np.roll(pos, -1, axis=0) - pos).T).sum())
        ctrl *= length / dense_len  # the spline is linear in its control points
        kappa_max = float(np.abs(_signed_curvature(d1, d2)).max()) * dense_len / length
        if kappa_max * min_radius <= 0.98:  # 2% margin for the resampling
            return ctrl
        radii = 1.0 + 0.85 * (radii - radii.mean())
    return None


def _finger(p0: np.ndarray, tangent: np.ndarray, normal: np.ndarray, half: float, corner: float,
            depth: float) -> np.ndarray:
    """A hairpin as a polyline (0.25 m steps) in the plane: from p0 - (half + corner) * tangent the road turns 90 deg
    towards `normal` (radius `corner`), runs `depth` m straight, turns round (a U of radius `half`), runs back and
    turns 90 deg onto the line again at p0 + (half + corner) * tangent. Legs 2 * half apart."""
    def arc(centre, radius, a0, a1):
        n = max(2, int(abs(a1 - a0) * radius / 0.25))
        t = np.linspace(a0, a1, n, endpoint=False)
        return centre + radius * (np.cos(t)[:, None] * tangent + np.sin(t)[:, None] * normal)

    def line(q0, q1):
        n = max(2, int(np.hypot(*(q1 - q0)) / 0.25))
        return q0 + np.linspace(0, 1, n, endpoint=False)[:, None] * (q1 - q0)

    a = half + corner
    # local coordinates (u along tangent, v along normal) -> world
    def w(u, v):
        return p0 + u * tangent + v * normal

    c1, c2 = w(-a, corner), w(a, corner)  # mouth corner centres
    top = corner + depth  # the U's centre is at v = top
    parts = [
        arc(c1, corner, -np.pi / 2, 0.0),  # (-a, 0) -> (-half, corner), heading along +normal
        line(w(-half, corner), w(-half, top)),
        arc(w(0.0, top), half, np.pi, 0.0),  # the U: (-half, top) over (0, top + half) to (half, top)
        line(w(half, top), w(half, corner)),
        arc(c2, corner, np.pi, 3 * np.pi / 2),  # (half, corner) -> (a, 0)
    ]
    return np.concatenate(parts, axis=0)


def _splice_hairpins(track: Track, n: int, min_radius: float, rng: np.random.Generator) -> np.ndarray | None:
    """The centreline with `n` hairpins spliced in where the road is nearly straight (|curvature| < 1/200 m over the
    finger's mouth: |curvature| < 1/200 m), each folding away from or into the loop at random: a closed polyline, or
    None if there is no room for them."""
    half = max(min_radius, 0.5 * track.road_width + 3.0) + rng.uniform(0.5, 2.0, n)
    corner = min_radius + rng.uniform(2.0, 5.0, n)
    depth = rng.uniform(20.0, 45.0, n)
    straight = np.abs(track.curvature) < 1.0 / 200.0  # a straight enough stretch: the finger's ends meet it smoothly
    pts = track.points
    cuts: list[tuple[int, int, np.ndarray]] = []
    order = rng.permutation(track.n)
    for k in range(n):
        a = half[k] + corner[k]
        w = int(math.ceil((a + 3.0) / track.ds))
        # centres whose whole window [i - w, i + w] is straight (a sliding count of straight points)
        run = np.convolve(straight.astype(np.int32), np.ones(2 * w + 1, np.int32), mode="same") == 2 * w + 1
        run[:w] = run[track.n - w:] = False
        for i in order[run[order]].tolist():
            lo, hi = i - w, i + w
            if any(lo - 60 < j1 and j0 < hi + 60 for j0, j1, _ in cuts):
                continue
            h = track.headings[i]
            tangent = np.array([math.cos(h), math.sin(h)])
            right = np.array([math.sin(h), -math.cos(h)])
            normal = right if rng.random() < 0.5 else -right
            i0, i1 = i - int(round(a / track.ds)), i + int(round(a / track.ds))
            cuts.append((i0, i1, _finger(pts[i], tangent, normal, half[k], corner[k], depth[k])))
            break
        else:
            return None
    out, last = [], 0
    for i0, i1, finger in sorted(cuts, key=lambda c: c[0]):
        out += [pts[last:i0], finger]
        last = i1
    out.append(pts[last:])
    return np.concatenate(out, axis=0)


def _resample_closed(points: np.ndarray, spacing: float, smooth_m: float) -> np.ndarray:
    """A closed polyline resampled at uniform arc length (~spacing), then smoothed by a circular Gaussian of
    `smooth_m` metres (rounds the kinks where arcs meet straights, so curvature has no spikes)."""
    seg = np.hypot(*(np.roll(points, -1, axis=0) - points).T)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    n = int(round(cum[-1] / spacing))
    s = np.arange(n) * (cum[-1] / n)
    closed = np.vstack([points, points[:1]])
    out = np.stack([np.interp(s, cum, closed[:, 0]), np.interp(s, cum, closed[:, 1])], axis=1)
    sigma = smooth_m / (cum[-1] / n)
    r = int(3 * sigma) + 1
    kern = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    kern /= kern.sum()
    wrapped = np.vstack([out[-r:], out, out[:r]])
    return np.stack([np.convolve(wrapped[:, d], kern, mode="valid") for d in (0, 1)], axis=1)


def generate_track(seed: int, theme: str = "lake", world: str = "classic") -> Track:
    """Track number `seed` of `theme`: deterministic, closed, smooth, non-self-intersecting (module doc).

    world="hard" draws from HARD_TRACK_PARAMS (tighter bends, hairpins) with a different random stream (so its
    tracks are not v0's) and adds hills (ELEVATION); world="classic" is UdacityStyle-v0's flat generator."""
    seed = check_seed(seed)
    check_theme(theme)
    hard = check_world(world) == "hard"
    p = (HARD_TRACK_PARAMS if hard else TRACK_PARAMS)[theme]
    rng = np.random.default_rng([seed, THEMES.index(theme), 0] + ([4] if hard else []))
    clearance = p.road_width + _SCENERY_GAP_M
    for _ in range(_MAX_DRAWS):
        k = int(rng.integers(p.n_controls[0], p.n_controls[1] + 1))
        angles = (np.arange(k) + rng.uniform(-p.angle_jitter, p.angle_jitter, k)) * (2 * np.pi / k)
        angles = np.sort(angles + rng.uniform(0, 2 * np.pi))
        radii = 1.0 + rng.uniform(-p.radius_jitter, p.radius_jitter, k)
        clockwise = bool(rng.random() < 0.5)
        length = float(rng.uniform(*p.length_range))
        ctrl = _fit_controls(angles, radii, length, max(p.min_radius, 14.0) if hard else p.min_radius,
                             clockwise and not hard)
        if ctrl is None:
            continue
        if clockwise and hard:
            ctrl = ctrl[::-1].copy()
        track = _spline_track(ctrl, p.road_width, theme, seed)
        # Enough on its own to rule out self-intersection: a crossing between points more than 2c apart
        # along the loop fails the clearance, and closing a loop within 2c would need a turn of pi
        # inside 2c < pi * min_radius metres (true for both themes). tests/ also run self_intersects().
        if track.min_clearance(exclude_arc=2 * clearance) < clearance:
            continue
        if hard:
            n_hairpins = int(rng.integers(*HAIRPINS[theme]))
            if n_hairpins:
                spliced = _splice_hairpins(track, n_hairpins, p.min_radius, rng)
                if spliced is None:
                    continue
                track = Track.from_points(_resample_closed(spliced, SPACING_M, 2.5), p.road_width,
                                          theme=theme, seed=seed)
                if (np.abs(track.curvature).max() * p.min_radius > 1.1
                        or track.min_clearance(exclude_arc=2 * clearance) < clearance or track.self_intersects(step=2)):
                    continue  # (a hairpin turns by pi within 2c, so the clearance alone does not rule out crossings)
            track = Track(track.points, track.headings, track.curvature, track.road_width, theme, seed,
                          elevation=_elevation(track, rng))
        return track
    raise RuntimeError(f"no valid {theme} track for seed {seed} in {_MAX_DRAWS} draws")
