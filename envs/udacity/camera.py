"""First-person cameras by one homography warp of a top-down texture of the track.

Why: a flat road on a ground plane, seen through a pinhole camera, is a projective image (homography)
of a top-down picture of that plane. So the track is drawn ONCE per episode into a texture at
PX_PER_M = 10 px/m (scenery, verges, asphalt, kerbs, edge lines, centre line, shadows, noise), and a
camera frame is one `cv2.warpPerspective` of that texture, plus a sky band with a distant panorama
that scrolls with the yaw, plus distance fog. Cost per frame is independent of the scene's detail.

Frames: uint8 RGB [FRAME_H=160, FRAME_W=320, 3] (Udacity's 320x160 camera images). Cameras look along
the car's heading, CAMERA_HEIGHT_M = 1.5 m above the road, pitched CAMERA_PITCH_DEG = 6 deg down, with
CAMERA_HFOV_DEG = 65 deg horizontal field of view (square pixels, principal point at the image
centre), so the horizon lies on row `horizon_row()` (about 53). They sit at the car's centre; the
"left" and "right" cameras are the same camera moved SIDE_CAMERA_OFFSET_M = 1.0 m sideways (as
Udacity's three cameras, used with a steering correction to teach recovery).

Rows just below the horizon (far ground, where one pixel is wider than a texel and one row spans
metres along the view direction) are warped from a half-resolution copy of the texture (a one-level
mip-map) at twice the row count and averaged down: less shimmer on dashes, kerbs and edges.
Fog: pixel = ground * (1 - w) + fog * w with w = 1 - exp(-distance / fog_distance), one weight per
row (precomputed: the distance of a row's ground point depends only on the row).

Themes: "lake" (bright; wide grey road with white edge lines, red/white kerbs in the bends, sandy
verges, grass, bushes, ponds with sandy shores; blue sky, distant mountains) and "jungle" (darker;
narrow dark road with white edge lines and a dashed yellow centre line, dirt verges, dense trees with
shadows across the road, denser green haze, a tree line on the horizon).
`domain_randomization=True` jitters the palette, brightness, fog and adds random shadow polygons:
all baked into the texture at reset (per-frame cost unchanged), drawn from the episode's seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import cv2
import numpy as np

from .track import THEMES, Track, check_theme
from .vehicle import CAR_LENGTH_M, CAR_WIDTH_M

FRAME_W, FRAME_H = 320, 160
CAMERA_HEIGHT_M = 1.5
CAMERA_PITCH_DEG = 6.0
CAMERA_HFOV_DEG = 65.0
SIDE_CAMERA_OFFSET_M = 1.0  # lateral shift of the "left" / "right" cameras from the centre one
CAMERAS = ("left", "center", "right")
_CAMERA_SHIFT = {"left": -SIDE_CAMERA_OFFSET_M, "center": 0.0, "right": SIDE_CAMERA_OFFSET_M}  # + = right
PX_PER_M = 10.0  # texture resolution
_MARGIN_M = 50.0  # texture extent beyond the track's bounding box (beyond: flat ground colour + fog)
_MAX_VIEW_M = 400.0  # ground farther than this is left to the fog colour

# Chase view (render_view="chase"): a virtual camera behind and above the car.
CHASE_W, CHASE_H = 640, 320
CHASE_BACK_M, CHASE_UP_M, CHASE_PITCH_DEG, CHASE_HFOV_DEG = 6.0, 4.0, 15.0, 75.0  # back: from the rear bumper


@dataclass(frozen=True)
class CameraModel:
    """Pinhole camera over a flat ground: image size, height above the ground, pitch, field of view."""

    width: int = FRAME_W
    height: int = FRAME_H
    cam_height: float = CAMERA_HEIGHT_M
    pitch_deg: float = CAMERA_PITCH_DEG
    hfov_deg: float = CAMERA_HFOV_DEG

    @property
    def f(self) -> float:
        """Focal length in pixels (square pixels)."""
        return (self.width / 2.0) / math.tan(math.radians(self.hfov_deg) / 2.0)

    @property
    def cx(self) -> float:
        return (self.width - 1) / 2.0

    @property
    def cy(self) -> float:
        return (self.height - 1) / 2.0

    def horizon_row(self) -> float:
        """Image row (float) of the horizon: the vanishing line of the ground plane."""
        return self.cy - self.f * math.tan(math.radians(self.pitch_deg))

    def row_distance(self, rows: np.ndarray) -> np.ndarray:
        """Horizontal distance (m) of the ground seen on the centre column at each row (inf above the horizon)."""
        below = np.arctan((np.asarray(rows, dtype=np.float64) - self.cy) / self.f) + math.radians(self.pitch_deg)
        with np.errstate(divide="ignore"):
            return np.where(below > 0, self.cam_height / np.tan(np.maximum(below, 1e-12)), np.inf)

    def ground_to_image(self, x: float, y: float, yaw: float) -> np.ndarray:
        """3x3 homography from ground (X, Y, 1) in metres to pixels (u, v, 1), camera above (x, y) looking along yaw."""
        return self.intrinsics() @ self.extrinsics(x, y, yaw)[:, [0, 1, 3]]

    def intrinsics(self) -> np.ndarray:
        f = self.f
        return np.array([[f, 0.0, self.cx], [0.0, f, self.cy], [0.0, 0.0, 1.0]])

    def extrinsics(self, x: float, y: float, yaw: float) -> np.ndarray:
        """3x4 [R | t] from world (X, Y, Z, 1) to camera coordinates (x right, y down, z forward)."""
        c, s = math.cos(yaw), math.sin(yaw)
        p = math.radians(self.pitch_deg)
        cp, sp = math.cos(p), math.sin(p)
        r = np.array(
            [
                [s, -c, 0.0],  # image right = the car's right
                [-sp * c, -sp * s, -cp],  # image down
                [cp * c, cp * s, -sp],  # optical axis, pitched down
            ]
        )
        t = -r @ np.array([x, y, self.cam_height])
        return np.concatenate([r, t[:, None]], axis=1)

    def project(self, pts: np.ndarray, x: float, y: float, yaw: float) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (u, v) of world points [N, 3] and their depth (camera z, m)."""
        pc = self.extrinsics(x, y, yaw) @ np.concatenate([pts, np.ones((len(pts), 1))], axis=1).T
        z = pc[2]
        uv = self.intrinsics()[:2, :2] @ (pc[:2] / np.maximum(z, 1e-6)) + np.array([[self.cx], [self.cy]])
        return uv.T, z


CENTER_CAMERA = CameraModel()
CHASE_CAMERA = CameraModel(CHASE_W, CHASE_H, CHASE_UP_M, CHASE_PITCH_DEG, CHASE_HFOV_DEG)


# --- palettes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Palette:
    """Colours (RGB) and look of one theme."""

    ground: tuple[int, int, int]
    ground2: tuple[int, int, int]  # second ground colour, mixed in by low-frequency noise (patches)
    verge: tuple[int, int, int]
    road: tuple[int, int, int]
    edge_line: tuple[int, int, int]
    centre_line: tuple[int, int, int] | None  # None = no centre line
    kerb: tuple[int, int, int] | None  # None = no kerbs; kerbs alternate this and edge_line
    tree: tuple[int, int, int]
    tree2: tuple[int, int, int]
    rock: tuple[int, int, int]
    water: tuple[int, int, int] | None
    shore: tuple[int, int, int]
    sky_top: tuple[int, int, int]
    sky_horizon: tuple[int, int, int]
    fog: tuple[int, int, int]
    far: tuple[int, int, int]  # panorama silhouette (mountains / tree line)
    fog_distance: float  # m
    verge_width: float  # m of dirt/sand beside each edge
    tree_spacing: float  # mean spacing (m) of scenery objects along each side
    tree_radius: tuple[float, float]  # m
    tree_lateral: tuple[float, float]  # m beyond the verge
    shadow_density: float  # tree shadows that reach the road, per tree (0..1)
    noise: float  # amplitude of the texture noise (fraction of the brightness)
    silhouette: str  # "mountains" or "treeline"
    edge_line_px: int = 2  # edge line width in texture pixels (PX_PER_M per metre)
    road_shift: float = 0.0  # m: the drawn road's centre lies this far right of the driven line (- = left: the
    #                          driven line is the right lane of a two-lane road, real_look.py)


PALETTES: dict[str, Palette] = {
    "lake": Palette(
        ground=(104, 142, 62), ground2=(140, 160, 80), verge=(190, 170, 120), road=(118, 118, 120),
        edge_line=(235, 235, 230), centre_line=None, kerb=(205, 45, 40), tree=(48, 90, 40), tree2=(70, 112, 48),
        rock=(128, 124, 118), water=(62, 110, 150), shore=(205, 190, 140),
        sky_top=(95, 150, 215), sky_horizon=(200, 215, 230), fog=(196, 210, 222), far=(120, 140, 165),
        fog_distance=160.0, verge_width=1.5, tree_spacing=4.0, tree_radius=(0.6, 2.5), tree_lateral=(1.0, 25.0),
        shadow_density=0.0, noise=0.10, silhouette="mountains",
    ),
    "jungle": Palette(
        ground=(48, 82, 36), ground2=(78, 92, 40), verge=(104, 84, 56), road=(78, 78, 82),
        edge_line=(220, 220, 215), centre_line=(226, 190, 60), kerb=None, tree=(22, 58, 24), tree2=(40, 86, 32),
        rock=(96, 96, 90), water=None, shore=(120, 110, 80),
        sky_top=(120, 150, 170), sky_horizon=(168, 182, 176), fog=(140, 156, 144), far=(44, 70, 46),
        fog_distance=70.0, verge_width=1.0, tree_spacing=3.0, tree_radius=(1.5, 4.5), tree_lateral=(0.5, 14.0),
        shadow_density=0.45, noise=0.16, silhouette="treeline",
    ),
    "mountain": Palette(
        ground=(112, 104, 92), ground2=(92, 104, 70), verge=(140, 128, 110), road=(70, 70, 74),
        edge_line=(230, 230, 225), centre_line=(235, 235, 230), kerb=(200, 40, 36), tree=(30, 62, 40),
        tree2=(46, 78, 50), rock=(120, 112, 104), water=None, shore=(140, 130, 110),
        sky_top=(80, 130, 200), sky_horizon=(190, 205, 222), fog=(186, 196, 206), far=(150, 156, 172),
        fog_distance=120.0, verge_width=0.8, tree_spacing=5.0, tree_radius=(1.0, 3.0), tree_lateral=(1.0, 18.0),
        shadow_density=0.3, noise=0.14, silhouette="mountains",
    ),
}
assert set(PALETTES) == set(THEMES)


def _jitter_palette(p: Palette, rng: np.random.Generator) -> Palette:
    """Domain randomisation of the palette: per-colour jitter, a global brightness and a colour cast."""
    brightness = rng.uniform(0.7, 1.3)
    cast = rng.uniform(-10, 10, 3)

    def jit(c):
        if c is None:
            return None
        v = (np.asarray(c, dtype=np.float64) + rng.uniform(-14, 14, 3) + cast) * brightness
        return tuple(int(x) for x in np.clip(v, 0, 255))

    colours = {k: jit(getattr(p, k)) for k in (
        "ground", "ground2", "verge", "road", "edge_line", "centre_line", "kerb", "tree", "tree2", "rock",
        "water", "shore", "sky_top", "sky_horizon", "fog", "far")}
    return replace(p, **colours, fog_distance=p.fog_distance * rng.uniform(0.6, 1.5))


# --- texture ------------------------------------------------------------------------------------


def _pts(xy: np.ndarray, to_tex: np.ndarray) -> np.ndarray:
    """World points [N, 2] -> texture pixel coordinates in cv2's fixed point (shift 3 = 1/8 px)."""
    uv = xy @ to_tex[:2, :2].T + to_tex[:2, 2]
    return np.round(uv * 8).astype(np.int32)


def _noise(shape: tuple[int, int], cell: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth value noise in [-1, 1]-ish, float32, with features about `cell` pixels wide."""
    h, w = shape
    small = rng.standard_normal((h // cell + 2, w // cell + 2)).astype(np.float32)
    big = cv2.resize(small, (w + 2 * cell, h + 2 * cell), interpolation=cv2.INTER_CUBIC)
    return big[cell : cell + h, cell : cell + w]


def _distance_to_track(track: Track, xy: np.ndarray) -> np.ndarray:
    """Distance (m) from each of the points [M, 2] to the nearest centreline point (every 2nd point)."""
    c = track.points[::2]
    out = np.empty(len(xy))
    for k in range(0, len(xy), 256):  # chunks keep the [M, N] matrix small
        p = xy[k : k + 256]
        out[k : k + 256] = np.sqrt(((p[:, None, :] - c[None, :, :]) ** 2).sum(-1).min(1))
    return out


def draw_texture(
    track: Track, pal: Palette, rng: np.random.Generator, random_shadows: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Top-down RGB texture of the track and its surroundings, and the 3x3 world->texture-pixel map.

    Layers are painted in a fixed order, each drawing from ``rng`` in turn, so a track seed gives one texture."""
    lo = track.points.min(0) - _MARGIN_M
    hi = track.points.max(0) + _MARGIN_M
    w, h = 2 * (np.ceil((hi - lo) * PX_PER_M / 2)).astype(int)  # even: the half-resolution copy is exact
    to_tex = np.array([[PX_PER_M, 0.0, -lo[0] * PX_PER_M], [0.0, -PX_PER_M, hi[1] * PX_PER_M], [0.0, 0.0, 1.0]])
    tex = _ground(pal, rng, h, w)
    if pal.water is not None:
        _water(tex, track, pal, rng, to_tex)
    shade = np.full((h, w), 255, np.uint8)  # multiplicative shading (255 = none)
    _scenery(tex, shade, track, pal, rng, to_tex)
    _road(tex, track, pal, to_tex)
    _cast_shadows(shade, track, rng, to_tex, random_shadows)
    return _grain_and_shade(tex, shade, pal, rng), to_tex


def _ground(pal: Palette, rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A second ground colour mixed in where low-frequency noise is high (patches ~8 m across), drawn at a
    quarter resolution and upscaled (it has no fine detail)."""
    patch = np.clip(_noise((h // 4 + 1, w // 4 + 1), 20, rng) * 0.8, 0, 1)
    small = cv2.merge(
        [cv2.convertScaleAbs(patch, alpha=float(g2 - g1), beta=float(g1)) for g1, g2 in zip(pal.ground, pal.ground2)]
    )
    big = cv2.resize(small, ((w // 4 + 1) * 4, (h // 4 + 1) * 4), interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(big[:h, :w])


def _water(tex: np.ndarray, track: Track, pal: Palette, rng: np.random.Generator, to_tex: np.ndarray) -> None:
    """A lake inside the loop and a few ponds outside, every shore >= 25 m from the road edge."""
    assert pal.water is not None  # drawn only for a palette with water
    aa, sh = cv2.LINE_AA, 3
    contour = track.points.astype(np.float32).reshape(-1, 1, 2)

    def inside_distance(xy: np.ndarray) -> np.ndarray:  # signed distance to the centreline, + = inside the loop
        return np.array([cv2.pointPolygonTest(contour, (float(a), float(b)), True) for a, b in xy])

    ponds = [(track.points.mean(0), 250.0)]
    for _ in range(int(rng.integers(2, 5))):
        x, y, hd = track.pose_at(rng.uniform(0, track.length))
        side, d = rng.choice([-1.0, 1.0]), rng.uniform(50, 70)
        ponds.append((np.array([x + side * d * math.sin(hd), y - side * d * math.cos(hd)]), rng.uniform(15, 35)))
    ang = np.linspace(0, 2 * np.pi, 72, endpoint=False)
    unit = np.stack([np.cos(ang), np.sin(ang)], 1)
    clear = track.half_width + 25.0
    for c, size in ponds:
        sign = 1.0 if inside_distance(c[None])[0] > 0 else -1.0  # which side of the loop the pond is on
        r = size * (1 + 0.15 * np.sin(3 * ang + rng.uniform(0, 6)) + 0.08 * np.sin(5 * ang + rng.uniform(0, 6)))
        for _ in range(30):  # shrink the vertices that come too close to the road (or cross it)
            bad = sign * inside_distance(c + r[:, None] * unit) < clear
            if not bad.any():
                break
            r = np.where(bad, r * 0.8, r)
        # smooth the shore
        r = np.asarray(sum(wk * np.roll(r, k) for k, wk in zip(range(-3, 4), (1, 4, 10, 14, 10, 4, 1)))) / 44.0
        poly = c + r[:, None] * unit
        if r.mean() < 8.0 or (sign * inside_distance(poly)).min() < clear - 5.0:
            continue
        cv2.fillPoly(tex, [_pts(poly, to_tex)], pal.shore, aa, sh)
        inner = c + (r[:, None] - 4.0) * unit
        cv2.fillPoly(tex, [_pts(inner, to_tex)], pal.water, aa, sh)


def _scenery(tex: np.ndarray, shade: np.ndarray, track: Track, pal: Palette, rng: np.random.Generator,
             to_tex: np.ndarray) -> None:
    """Trees / bushes (two greens, darker core; their shadows go into ``shade``) and rocks beside the road."""
    aa, sh = cv2.LINE_AA, 3
    hw, ppm = track.half_width, PX_PER_M
    n_obj = int(2 * track.length / pal.tree_spacing)
    s_obj = rng.uniform(0, track.length, n_obj)
    side = rng.choice([-1.0, 1.0], n_obj)
    lat = side * (hw + pal.verge_width + rng.uniform(*pal.tree_lateral, n_obj))
    radius = rng.uniform(*pal.tree_radius, n_obj)
    is_rock = rng.random(n_obj) < 0.15
    u = s_obj / track.ds
    i0 = u.astype(int) % track.n
    base, hd = track.points[i0], track.headings[i0]
    obj = base + lat[:, None] * np.stack([np.sin(hd), -np.cos(hd)], 1)
    keep = _distance_to_track(track, obj) > hw + pal.verge_width + 0.3 + radius * 0.5
    sun = rng.uniform(0, 2 * np.pi)
    sun_dir = np.array([math.cos(sun), math.sin(sun)])
    for (ox, oy), r, rock, k in zip(obj, radius, is_rock, keep):
        if not k:
            continue
        c = _pts(np.array([[ox, oy]]), to_tex)[0]
        if rock:
            rr = int(r * 0.5 * ppm * 8)
            cv2.ellipse(tex, tuple(c), (rr, int(rr * 0.7)), float(rng.uniform(0, 180)), 0, 360, pal.rock, -1, aa, sh)
            continue
        col = pal.tree if rng.random() < 0.5 else pal.tree2
        rr = int(r * ppm * 8)
        if pal.shadow_density > 0 and rng.random() < pal.shadow_density:
            sc = _pts(np.array([[ox, oy]]) + sun_dir * r * 1.6, to_tex)[0]
            cv2.ellipse(shade, tuple(sc), (int(rr * 1.5), int(rr * 0.9)), math.degrees(-sun), 0, 360, 150, -1, aa, sh)
        cv2.circle(tex, tuple(c), rr, col, -1, aa, sh)
        cv2.circle(tex, tuple(c), int(rr * 0.55), tuple(int(v * 0.8) for v in col), -1, aa, sh)


def _road(tex: np.ndarray, track: Track, pal: Palette, to_tex: np.ndarray) -> None:
    """Verges, asphalt, kerbs, edge lines, centre line."""
    aa, sh = cv2.LINE_AA, 3
    hw, ppm, shift = track.half_width, PX_PER_M, pal.road_shift
    centre_px = _pts(track.offset_points(shift) if shift else track.points, to_tex)
    # (the wide bands without anti-aliasing: 4x faster, and their edges lie under the edge lines' blur)
    verge_px = int(round((track.road_width + 2 * pal.verge_width) * ppm))
    cv2.polylines(tex, [centre_px], True, pal.verge, verge_px, cv2.LINE_8, sh)
    cv2.polylines(tex, [centre_px], True, pal.road, int(round(track.road_width * ppm)), cv2.LINE_8, sh)
    if pal.kerb is not None:  # red/white kerbs in the bends (|curvature| > 1/70 m), both sides, 1.5 m blocks
        bend = np.abs(track.curvature) > 1.0 / 70.0
        step = max(1, int(round(1.5 / track.ds)))
        for lateral in (shift - (hw + 0.45), shift + hw + 0.45):
            edge = _pts(track.offset_points(lateral), to_tex)
            blocks: dict[int, list[np.ndarray]] = {0: [], 1: []}
            for k, i in enumerate(range(0, track.n - step, step)):
                if bend[i]:
                    blocks[k % 2].append(edge[i : i + step + 1])
            if blocks[0]:
                cv2.polylines(tex, blocks[0], False, pal.kerb, int(round(0.9 * ppm)), cv2.LINE_8, sh)
            if blocks[1]:
                cv2.polylines(tex, blocks[1], False, pal.edge_line, int(round(0.9 * ppm)), cv2.LINE_8, sh)
    for lateral in (shift - (hw - 0.25), shift + hw - 0.25):
        cv2.polylines(tex, [_pts(track.offset_points(lateral), to_tex)], True, pal.edge_line, pal.edge_line_px, aa, sh)
    if pal.centre_line is not None:  # dashes 3 m long every 7 m
        period, on = int(round(7.0 / track.ds)), int(round(3.0 / track.ds))
        dashes = [centre_px[i : i + on + 1] for i in range(0, track.n - on, period)]
        cv2.polylines(tex, dashes, False, pal.centre_line, 2, aa, sh)


def _cast_shadows(shade: np.ndarray, track: Track, rng: np.random.Generator, to_tex: np.ndarray, count: int) -> None:
    """Domain randomisation: ``count`` random dark polygons (cast shadows) across and beside the road."""
    for _ in range(count):
        x, y, hd = track.pose_at(rng.uniform(0, track.length))
        c = np.array([x, y]) + rng.uniform(-track.road_width, track.road_width, 2)
        ang = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 7))))
        rad = rng.uniform(2.0, 9.0, len(ang))
        poly = c + rad[:, None] * np.stack([np.cos(ang), np.sin(ang)], 1)
        cv2.fillPoly(shade, [_pts(poly, to_tex)], int(rng.integers(90, 190)), cv2.LINE_AA, 3)


def _grain_and_shade(tex: np.ndarray, shade: np.ndarray, pal: Palette, rng: np.random.Generator) -> np.ndarray:
    """Texture noise and shading in one multiply: tex * (1 + medium) * (1 + fine) * shade / 255, in uint8
    (128 = 1.0): medium = ~1.5 m blotches (quarter resolution, upscaled), fine = ~0.2 m grain (a tiled 512 px
    patch: its 51 m period is invisible under perspective and fog)."""
    h, w = shade.shape
    medium = _noise((h // 4 + 1, w // 4 + 1), 4, rng)
    medium = np.clip(128.0 * (1.0 + pal.noise * 0.35 * medium), 0, 255).astype(np.uint8)
    medium = cv2.resize(medium, ((w // 4 + 1) * 4, (h // 4 + 1) * 4), interpolation=cv2.INTER_LINEAR)[:h, :w]
    tile = np.clip(128.0 * (1.0 + pal.noise * 0.25 * _noise((512, 512), 2, rng)), 0, 255).astype(np.uint8)
    fine = np.tile(tile, (h // 512 + 1, w // 512 + 1))[:h, :w]
    mult = cv2.multiply(medium, fine, scale=1.0 / 128.0)
    mult = cv2.multiply(mult, shade, scale=1.0 / 255.0)
    return cv2.multiply(tex, cv2.cvtColor(mult, cv2.COLOR_GRAY2RGB), scale=1.0 / 128.0)


# --- sky ----------------------------------------------------------------------------------------


def _sky(cam: CameraModel, pal: Palette, rng: np.random.Generator, rows: int) -> np.ndarray:
    """Sky band [rows, P, 3] for a panorama of P = 2*pi*f columns (column c = azimuth -c/f), twice side by side.

    A vertical gradient with a distant silhouette (mountains or a tree line) rising from the horizon.
    Periodic by construction (integer frequencies), so the wrap-around is seamless."""
    p = int(round(2 * math.pi * cam.f))
    horizon = cam.horizon_row()
    t = np.clip(np.arange(rows, dtype=np.float32) / max(horizon, 1.0), 0, 1)[:, None]
    grad = (1 - t) * np.asarray(pal.sky_top, np.float32) + t * np.asarray(pal.sky_horizon, np.float32)
    sky = np.repeat(grad[:, None, :], p, axis=1)
    col = np.arange(p) * (2 * np.pi / p)
    scale = cam.f / CENTER_CAMERA.f  # silhouette heights scale with the focal length
    if pal.silhouette == "mountains":
        ks = np.arange(1, 40)
        amp = 7.0 / ks**0.9
        height = 10.0 + (amp[:, None] * np.sin(ks[:, None] * col + rng.uniform(0, 2 * np.pi, len(ks))[:, None])).sum(0)
        height = np.clip(height, 1.0, None)
    else:
        ks = np.arange(1, 200)
        amp = 4.0 / ks**0.6
        phase = rng.uniform(0, 2 * np.pi, len(ks))[:, None]
        height = 13.0 + 0.35 * (amp[:, None] * np.sin(ks[:, None] * col + phase)).sum(0)
        height = np.clip(height, 4.0, None)
    height *= scale
    r = np.arange(rows, dtype=np.float32)[:, None]
    top = horizon + 0.5 - height[None, :]
    cover = np.clip(r - top, 0.0, 1.0)[..., None]  # anti-aliased silhouette edge
    # Haze: the silhouette fades into the horizon colour towards its foot.
    depth = np.clip((r - top) / np.maximum(height[None, :], 1.0), 0, 1)[..., None]
    far = np.asarray(pal.far, np.float32) * (1 - 0.35 * depth) + np.asarray(pal.fog, np.float32) * 0.35 * depth
    sky = sky * (1 - cover) + far * cover
    below = r[:, 0] >= horizon  # ground beyond _MAX_VIEW_M, left to the fog
    sky[below] = pal.fog
    sky = np.clip(sky, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([sky, sky], axis=1))


# --- renderer -----------------------------------------------------------------------------------


class _CameraView:
    """Per-camera-model constants: the two warp bands, fog weights, sky (all RGBA: see Renderer)."""

    def __init__(self, cam: CameraModel, pal: Palette, rng: np.random.Generator) -> None:
        self.cam = cam
        rows = np.arange(cam.height)
        dist = cam.row_distance(rows)
        self.r0 = int(np.argmax(dist < _MAX_VIEW_M))  # first row warped; above it: sky (and fog colour)
        # Far band: rows whose pixels are wider than a texel (distance > f / PX_PER_M) come from the half
        # resolution texture, warped at twice the row count and area-averaged down (vertical anti-aliasing:
        # there one row spans several texels along the view direction).
        self.r_far = max(self.r0, int(np.argmax(dist < cam.f / PX_PER_M)))
        self.sky = cv2.cvtColor(_sky(cam, pal, rng, self.r0), cv2.COLOR_RGB2RGBA)
        self.pano = self.sky.shape[1] // 2
        w = 1.0 - np.exp(-dist / pal.fog_distance)
        w[: self.r0] = 1.0
        light = w[self.r0 :] < 1.0 / 255.0  # rows too close for any fog
        self.rf = self.r0 + int(np.argmax(light)) if light.any() else cam.height
        wf = w[self.r0 : self.rf, None, None]
        shape = (self.rf - self.r0, cam.width, 4)
        fog = np.asarray(tuple(pal.fog) + (0,), np.float64)
        self.fog_mul = np.ascontiguousarray(np.broadcast_to(np.round(255 * (1 - wf)), shape).astype(np.uint8))
        self.fog_add = np.ascontiguousarray(np.broadcast_to(np.round(wf * fog), shape).astype(np.uint8))
        # Constant right factor of the image -> ground map (see Renderer._ground_map), one per band:
        # pixel (u, v') of a band's buffer -> camera ray in (right, forward, up) coordinates.
        p = math.radians(cam.pitch_deg)
        cp, sp = math.cos(p), math.sin(p)
        to_car = np.array([[1.0, 0.0, 0.0], [0.0, -sp, cp], [0.0, -cp, -sp]])  # camera (x right, y down, z fwd) -> car
        k_inv = np.linalg.inv(cam.intrinsics())
        self.q_far = to_car @ k_inv @ np.array([[1.0, 0, 0], [0, 0.5, self.r0 - 0.25], [0, 0, 1]])  # 2 sub-rows per row
        self.q_near = to_car @ k_inv @ np.array([[1.0, 0, 0], [0, 1, self.r_far], [0, 0, 1]])
        self.far_buf = np.empty((2 * (self.r_far - self.r0), cam.width, 4), np.uint8)


class Renderer:
    """Draws one track's texture at construction and renders camera frames from car poses.

    pose = (x, y, yaw) of the car centre (world frame of track.py). Deterministic: same
    (track, theme, seed, domain_randomization) -> same texture -> same frames. Textures are kept as
    RGBA: OpenCV's bilinear warp is about twice as fast on 4 channels as on 3; the frame is converted
    to RGB at the end.
    """

    def __init__(self, track: Track, theme: str, seed: int, *, domain_randomization: bool = False) -> None:
        check_theme(theme)
        rng = np.random.default_rng([int(seed), THEMES.index(theme), 1])
        pal = PALETTES[theme]
        shadows = 0
        if domain_randomization:
            dr_rng = np.random.default_rng([int(seed), THEMES.index(theme), 2])
            pal = _jitter_palette(pal, dr_rng)
            shadows = int(dr_rng.integers(int(track.length / 40), int(track.length / 15)))
        self.track, self.theme, self.palette = track, theme, pal
        texture, self.to_tex = draw_texture(track, pal, rng, shadows)
        self.texture = cv2.cvtColor(texture, cv2.COLOR_RGB2RGBA)
        del texture
        th, tw = self.texture.shape[:2]  # both even (draw_texture)
        self.texture_far = cv2.resize(self.texture, (tw // 2, th // 2), interpolation=cv2.INTER_AREA)
        # Half-resolution pixel centres: u_far = (u + 0.5) / 2 - 0.5.
        self.to_tex_far = np.array([[0.5, 0.0, -0.25], [0.0, 0.5, -0.25], [0.0, 0.0, 1.0]]) @ self.to_tex
        self._border = tuple(int(v) for v in pal.ground) + (0,)
        self._seed = int(seed)
        self.view = _CameraView(CENTER_CAMERA, pal, rng)
        self._chase_view: _CameraView | None = None

    @staticmethod
    def camera_position(pose: tuple[float, float, float], camera: str) -> tuple[float, float, float]:
        """(x, y, yaw) of `camera` ("left" | "center" | "right") for a car centre pose."""
        if camera not in _CAMERA_SHIFT:
            raise ValueError(f"camera must be one of {CAMERAS}, got {camera!r}")
        x, y, yaw = pose
        d = _CAMERA_SHIFT[camera]
        return x + d * math.sin(yaw), y - d * math.cos(yaw), yaw

    @staticmethod
    def _ground_map(to_tex: np.ndarray, cam: CameraModel, x: float, y: float, yaw: float, q: np.ndarray) -> np.ndarray:
        """3x3 map from a band's pixels to texture pixels: to_tex @ A(x, y, h) @ Z(yaw) @ q.

        A ray d (world) from the camera at (x, y, h) meets the ground at (x, y) + h * d_xy / -d_z, i.e. the
        homogeneous point (h d_x - x d_z, h d_y - y d_z, -d_z): linear in d. Z(yaw) turns car-frame
        (right, forward, up) into world axes; q (constant per band) turns pixels into car-frame rays.
        Written out in scalars: this runs for every frame and is 10x cheaper than building and inverting
        the projection matrix with numpy."""
        # to_tex = [[p, 0, tx], [0, -p, ty], [0, 0, 1]]
        p, tx, ty = float(to_tex[0, 0]), float(to_tex[0, 2]), float(to_tex[1, 2])
        h = cam.cam_height
        s, c = math.sin(yaw), math.cos(yaw)
        ph = p * h
        left = np.array([[ph * s, ph * c, -p * x - tx], [ph * c, -ph * s, p * y - ty], [0.0, 0.0, -1.0]])
        return left @ q

    def _render(self, view: _CameraView, x: float, y: float, yaw: float) -> np.ndarray:
        cam = view.cam
        frame = np.empty((cam.height, cam.width, 4), np.uint8)
        # Sky: the panorama column for azimuth a is -a * f (mod P); image column u looks at yaw + (cx - u) / f.
        start = int(round(-yaw * cam.f - cam.cx)) % view.pano
        frame[: view.r0] = view.sky[:, start : start + cam.width]
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        if view.r_far > view.r0:
            m = self._ground_map(self.to_tex_far, cam, x, y, yaw, view.q_far)
            buf = view.far_buf
            cv2.warpPerspective(self.texture_far, m, (cam.width, len(buf)), dst=buf, flags=flags,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=self._border)
            cv2.addWeighted(buf[0::2], 0.5, buf[1::2], 0.5, 0.0, dst=frame[view.r0 : view.r_far])  # mean of row pairs
        m = self._ground_map(self.to_tex, cam, x, y, yaw, view.q_near)
        cv2.warpPerspective(self.texture, m, (cam.width, cam.height - view.r_far), dst=frame[view.r_far :],
                            flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=self._border)
        band = frame[view.r0 : view.rf]
        cv2.multiply(band, view.fog_mul, dst=band, scale=1.0 / 255.0)
        cv2.add(band, view.fog_add, dst=band)
        return cv2.cvtColor(frame, cv2.COLOR_RGBA2RGB)

    def render(self, pose: tuple[float, float, float], camera: str = "center") -> np.ndarray:
        """uint8 RGB frame [160, 320, 3] of `camera` for the car centre pose (x, y, yaw)."""
        return self._render(self.view, *self.camera_position(pose, camera))

    def render_chase(self, pose: tuple[float, float, float], steer: float = 0.0) -> np.ndarray:
        """uint8 RGB [CHASE_H, CHASE_W, 3]: a camera CHASE_BACK_M behind the car's rear and CHASE_UP_M above
        the ground, looking along the car, with the car drawn. `steer` = actual wheel angle (rad, + = right)."""
        if self._chase_view is None:
            self._chase_view = _CameraView(CHASE_CAMERA, self.palette, np.random.default_rng([self._seed, 7]))
        x, y, yaw = pose
        back = CHASE_BACK_M + CAR_LENGTH_M / 2
        cam_pose = (x - back * math.cos(yaw), y - back * math.sin(yaw), yaw)
        frame = self._render(self._chase_view, *cam_pose)
        _draw_car(frame, CHASE_CAMERA, cam_pose, pose, steer)
        return frame


def _draw_car(frame: np.ndarray, cam: CameraModel, cam_pose: tuple[float, float, float],
              pose: tuple[float, float, float], steer: float) -> None:
    """Draw the car as a shaded box (with a shadow and steered front wheels) into a chase frame."""
    x, y, yaw = pose
    fwd = np.array([math.cos(yaw), math.sin(yaw), 0.0])
    right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
    up = np.array([0.0, 0.0, 1.0])
    centre = np.array([x, y, 0.0])
    hl, hw = CAR_LENGTH_M / 2, CAR_WIDTH_M / 2

    def pt(f, r, z):
        return centre + f * fwd + r * right + z * up

    def poly(points, colour):
        uv, z = cam.project(np.array(points), *cam_pose)
        if (z > 0.1).all():
            cv2.fillPoly(frame, [np.round(uv * 8).astype(np.int32)], colour, cv2.LINE_AA, 3)

    m = 0.2  # shadow margin
    poly([pt(-hl - m, -hw - m, 0), pt(-hl - m, hw + m, 0), pt(hl + m, hw + m, 0), pt(hl + m, -hw - m, 0)], (30, 30, 30))
    # Front wheels, steered (visible beside the body from behind and above).
    for side in (-1.0, 1.0):
        wc = centre + 1.25 * fwd + side * (hw + 0.05) * right
        wf = math.cos(yaw - steer) * np.array([1, 0, 0]) + math.sin(yaw - steer) * np.array([0, 1, 0])
        wr = np.array([wf[1], -wf[0], 0.0])
        lift = np.array([0, 0, 0.02])
        corners = [wc + a * 0.35 * wf + b * 0.13 * wr + lift for a, b in ((-1, -1), (-1, 1), (1, 1), (1, -1))]
        poly(corners, (15, 15, 15))
    body, roof = 0.9, 1.4
    poly([pt(-hl, -hw, 0.3), pt(-hl, hw, 0.3), pt(-hl, hw, body), pt(-hl, -hw, body)], (150, 25, 25))  # rear face
    poly([pt(-hl, -hw, body), pt(-hl, hw, body), pt(hl, hw, body), pt(hl, -hw, body)], (215, 45, 40))  # bonnet/boot top
    rw = hw - 0.15  # roof half-width
    poly([pt(-0.9, -rw, roof), pt(-0.9, rw, roof), pt(0.7, rw, roof), pt(0.7, -rw, roof)], (230, 70, 60))
    poly([pt(-1.3, -hw + 0.05, body), pt(-1.3, hw - 0.05, body), pt(-0.9, rw, roof), pt(-0.9, -rw, roof)], (60, 75, 95))
    for side in (-1.0, 1.0):  # rear lights
        poly([pt(-hl - 0.01, side * (hw - 0.1), 0.6), pt(-hl - 0.01, side * (hw - 0.5), 0.6),
              pt(-hl - 0.01, side * (hw - 0.5), 0.78), pt(-hl - 0.01, side * (hw - 0.1), 0.78)], (255, 200, 60))
