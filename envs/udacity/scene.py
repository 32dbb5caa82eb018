"""The hard world's cameras (UdacityStyle-v1): hills, things beside the road that hide it, the hood, lighting.

Why not camera.py's single homography: a homography is exact only for a flat ground. Here the ground is a
heightfield (the road's elevation spread sideways to the terrain), so each frame is drawn in four passes:

1. Ground, by ray casting along one profile. The terrain height is sampled along the camera's viewing
   direction (a 1-D profile, 96 distances out to 400 m) and every image row's ray is marched along it: the
   row sees the ground at the first distance where the ray drops below the profile, or the sky if it never
   does (over a crest the road vanishes and reappears farther on). All columns of a row share that forward
   distance (the terrain is taken as level across the view, exact on the road, which is level across), so
   a row is an affine map of the texture, and the frame is one `cv2.remap` per mip level (texture at 10,
   5 and 2.5 px/m for near, middle and far rows: no shimmer on dashes and kerbs far away).
2. Sky: a panorama indexed by the rays' elevation angle, so the horizon moves when the car pitches (the
   camera pitches with the road's grade under the car).
3. Objects as upright quads, far to near, each cut off below the row where nearer terrain hides it: trees,
   delineator posts, guard rails in the sharp bends, rock walls (mountain), billboards. They occlude the road.
4. Fog per row (by distance), the hood of the car at the bottom of every frame, the condition's light.

Conditions (`CONDITION_LOOKS`): "clear" (sun, hard shadows), "overcast" (flat grey light, no shadows),
"dusk" (low orange sun, dark, long shadows), "fog" (visibility of tens of metres). Every random choice comes
from the (seed, theme) generator, so a seed always draws the same scene.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import cv2
import numpy as np

from .camera import CAMERAS, CENTER_CAMERA, PALETTES, PX_PER_M, CameraModel, Palette, _jitter_palette, _pts, _sky
from .camera import _CAMERA_SHIFT, draw_texture
from .real_look import real_look
from .track import THEMES, Track, check_theme

LOOKS = ("sim", "real")  # HillsRenderer(look=...): v1's own, or v2's (real_look.py)
_HM_RES_M = 2.0  # heightmap cell
_PROFILE_M = np.geomspace(0.6, 400.0, 96)  # distances (m) of the terrain profile along the view
_SKY_DEG = 32.0  # the sky panorama spans elevation angles -_SKY_DEG.._SKY_DEG at least (more for steep cameras)
HOOD_ROWS = 14  # the car's hood covers up to this many rows at the bottom of the frame


@dataclass(frozen=True)
class ConditionLook:
    """How one lighting / weather condition changes a theme's palette and shadows."""

    brightness: float
    cast: tuple[float, float, float]  # added to every colour (RGB) before the brightness
    fog_scale: float  # x the theme's fog distance
    fog_colour: tuple[int, int, int] | None  # None: the theme's
    sky: tuple[tuple[int, int, int], tuple[int, int, int]] | None  # (top, horizon) or None: the theme's
    shadow: float  # darkness of cast shadows (0 = none, 1 = black)
    shadow_length: float  # x an object's height


CONDITION_LOOKS: dict[str, ConditionLook] = {
    "clear": ConditionLook(1.0, (0, 0, 0), 1.0, None, None, 0.45, 0.8),
    "overcast": ConditionLook(0.82, (-4, -2, 6), 0.7, (170, 174, 180), ((150, 156, 166), (190, 194, 200)), 0.0, 0.0),
    "dusk": ConditionLook(0.55, (30, 0, -30), 0.8, (150, 110, 100), ((70, 60, 110), (240, 150, 90)), 0.5, 2.5),
    "fog": ConditionLook(0.92, (0, 0, 4), 0.2, (196, 198, 202), ((190, 193, 198), (200, 202, 206)), 0.15, 0.8),
}
CONDITIONS = tuple(CONDITION_LOOKS)


def check_look(look: str) -> str:
    if look not in LOOKS:
        raise ValueError(f"look must be one of {LOOKS}, got {look!r}")
    return look


def check_condition(condition: str) -> str:
    if condition not in CONDITION_LOOKS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {condition!r}")
    return condition


def condition_palette(pal: Palette, condition: str) -> Palette:
    """The theme's palette under `condition` (colours cast and scaled, fog and sky replaced)."""
    look = CONDITION_LOOKS[check_condition(condition)]

    def light(c):
        if c is None:
            return None
        return tuple(int(v) for v in np.clip((np.asarray(c, float) + look.cast) * look.brightness, 0, 255))

    names = ("ground", "ground2", "verge", "road", "edge_line", "centre_line", "kerb", "tree", "tree2", "rock",
             "water", "shore", "far")
    out = replace(pal, **{k: light(getattr(pal, k)) for k in names}, fog_distance=pal.fog_distance * look.fog_scale)
    if look.fog_colour is not None:
        out = replace(out, fog=light(look.fog_colour))
    else:
        out = replace(out, fog=light(pal.fog))
    top, hor = look.sky if look.sky is not None else (pal.sky_top, pal.sky_horizon)
    return replace(out, sky_top=light(top), sky_horizon=light(hor))


def heightmap(track: Track, lo: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Terrain height [rows, cols] on a _HM_RES_M grid whose cell (0, 0) is at world `lo` (x east, row = y north):
    the elevation of the nearest centreline point, smoothed, so the road is level across and the land beside it
    follows it."""
    h, w = shape
    seed = np.full((h, w), 255, np.uint8)
    idx = np.floor((track.points - lo) / _HM_RES_M).astype(int)
    ok = (idx[:, 0] >= 0) & (idx[:, 0] < w) & (idx[:, 1] >= 0) & (idx[:, 1] < h)
    seed[idx[ok, 1], idx[ok, 0]] = 0
    which = np.full((h, w), -1, np.int64)
    which[idx[ok, 1], idx[ok, 0]] = np.nonzero(ok)[0]
    _, labels = cv2.distanceTransformWithLabels(seed, cv2.DIST_L2, 5, labelType=cv2.DIST_LABEL_PIXEL)
    zero_cells = np.flatnonzero(seed.ravel() == 0)  # label k (1-based) is the k-th zero cell in scan order
    point_of_label = which.ravel()[zero_cells]
    assert track.elevation is not None  # Track fills it (zeros when flat)
    z = track.elevation[point_of_label[labels - 1]].astype(np.float32)
    return cv2.GaussianBlur(z, (0, 0), 1.5)


class HillsRenderer:
    """Draws one (track, theme, seed, condition) scene and renders camera frames from car poses.

    pose = (x, y, yaw, grade): the car centre, its heading and the grade under it along the heading (the car
    pitches nose-up by atan(grade)). Same interface as camera.Renderer otherwise.
    """

    def __init__(self, track: Track, theme: str, seed: int, *, condition: str = "clear",
                 domain_randomization: bool = False, look: str = "sim") -> None:
        check_theme(theme)
        self.condition = check_condition(condition)
        rng = np.random.default_rng([int(seed), THEMES.index(theme), 5])
        if check_look(look) == "real":  # UdacityStyle-v2: the real simulator's camera and look, drawn per seed
            pal, self.camera = real_look(track, theme, seed)
        else:
            pal, self.camera = PALETTES[theme], CENTER_CAMERA
            if pal.kerb is None:  # every theme has kerbs in the hard world
                pal = replace(pal, kerb=(196, 40, 36))
        pal = replace(pal, tree_spacing=1e9)  # trees are upright objects here, not discs in the texture
        if domain_randomization:
            pal = _jitter_palette(pal, np.random.default_rng([int(seed), THEMES.index(theme), 6]))
        self.palette = pal = condition_palette(pal, condition)
        self.track, self.theme = track, theme
        light = CONDITION_LOOKS[condition]
        tex, self.to_tex = draw_texture(track, pal, rng)
        self.objects = _Objects(track, theme, pal, rng)
        if light.shadow > 0:
            self.objects.cast_shadows(tex, self.to_tex, light, rng)
        tex = cv2.cvtColor(tex, cv2.COLOR_RGB2RGBA)
        self.mips = [tex]
        for _ in range(2):
            t = self.mips[-1]
            self.mips.append(cv2.resize(t, (t.shape[1] // 2, t.shape[0] // 2), interpolation=cv2.INTER_AREA))
        self._border = tuple(int(v) for v in pal.ground) + (0,)
        # heightmap over the texture's extent
        p, tx, ty = float(self.to_tex[0, 0]), float(self.to_tex[0, 2]), float(self.to_tex[1, 2])
        self._lo = np.array([-tx / p, (ty - tex.shape[0]) / p])  # world (x, y) of the texture's bottom-left
        hm_shape = (int(math.ceil(tex.shape[0] / p / _HM_RES_M)) + 1, int(math.ceil(tex.shape[1] / p / _HM_RES_M)) + 1)
        self.height = heightmap(track, self._lo, hm_shape)
        self.objects.bind(self.height_at)
        self._views: dict[tuple, _RayView] = {}
        self._sky_seed = THEMES.index(theme)  # one skyline per theme (and look): cached across resets
        self.view = self._view(self.camera)
        self._rays_key: tuple | None = None
        self._rays: tuple | None = None
        self._hood = _hood(self.camera, pal)

    def _view(self, cam: CameraModel) -> _RayView:
        key = (cam.width, cam.height, cam.hfov_deg)
        if key not in self._views:
            self._views[key] = _RayView(cam, self.palette, self._sky_seed)
        return self._views[key]

    def height_at(self, x: np.ndarray | float, y: np.ndarray | float) -> np.ndarray:
        """Terrain height (m) at world points, bilinear in the heightmap (edge values beyond it)."""
        gx = (np.asarray(x, np.float64) - self._lo[0]) / _HM_RES_M - 0.5
        gy = (np.asarray(y, np.float64) - self._lo[1]) / _HM_RES_M - 0.5
        h, w = self.height.shape
        gx = np.clip(gx, 0, w - 1.001)
        gy = np.clip(gy, 0, h - 1.001)
        ix, iy = gx.astype(int), gy.astype(int)
        fx, fy = gx - ix, gy - iy
        z = self.height
        return ((z[iy, ix] * (1 - fx) + z[iy, ix + 1] * fx) * (1 - fy)
                + (z[iy + 1, ix] * (1 - fx) + z[iy + 1, ix + 1] * fx) * fy)

    @staticmethod
    def camera_position(pose: tuple, camera: str) -> tuple[float, float, float, float]:
        if camera not in _CAMERA_SHIFT:
            raise ValueError(f"camera must be one of {CAMERAS}, got {camera!r}")
        x, y, yaw, grade = pose
        d = _CAMERA_SHIFT[camera]
        return x + d * math.sin(yaw), y - d * math.cos(yaw), yaw, grade

    def render(self, pose: tuple, camera: str = "center") -> np.ndarray:
        """uint8 RGB frame [160, 320, 3] of `camera` for the car pose (x, y, yaw, grade)."""
        x, y, yaw, grade = self.camera_position(pose, camera)
        pitch = self.camera.pitch_deg - math.degrees(math.atan(grade))
        # The side cameras, 1 m beside the centre one over a road that is level across, see the ground at the
        # same distances row by row: one ray cast per pose serves all three.
        key = (tuple(pose), pitch)
        if self._rays_key != key:
            self._rays = self._cast(self.view, x, y, yaw, pitch, self.camera.cam_height)
            self._rays_key = key
        assert self._rays is not None
        frame = self._render(self.view, x, y, yaw, pitch, self._rays)
        self._hood(frame)
        return cv2.cvtColor(frame, cv2.COLOR_RGBA2RGB)

    def render_chase(self, pose: tuple, steer: float = 0.0) -> np.ndarray:
        """A camera behind and above the car (camera.CHASE_*), the car drawn: for watching, not for students."""
        from .camera import CAR_LENGTH_M, CHASE_BACK_M, CHASE_CAMERA, _draw_car

        x, y, yaw, grade = pose
        back = CHASE_BACK_M + CAR_LENGTH_M / 2
        cx, cy = x - back * math.cos(yaw), y - back * math.sin(yaw)
        z_car = float(self.height_at(x, y))
        view = self._view(CHASE_CAMERA)
        up = z_car + CHASE_CAMERA.cam_height - float(self.height_at(cx, cy))
        frame = self._render(view, cx, cy, yaw, CHASE_CAMERA.pitch_deg,
                             self._cast(view, cx, cy, yaw, CHASE_CAMERA.pitch_deg, up))
        frame = cv2.cvtColor(frame, cv2.COLOR_RGBA2RGB)
        _draw_car(frame, CHASE_CAMERA, (cx, cy, yaw), (x, y, yaw), steer)
        return frame

    def _cast(self, view: _RayView, x: float, y: float, yaw: float, pitch_deg: float, cam_up: float) -> tuple:
        """March every row's ray along the terrain profile ahead: (ground distance per row, rows that see ground,
        forward part of each row's ray, camera height)."""
        cam = view.cam
        c, s = math.cos(yaw), math.sin(yaw)
        z_cam = float(self.height_at(x, y)) + cam_up
        profile = self.height_at(x + _PROFILE_M * c, y + _PROFILE_M * s) - z_cam
        p = math.radians(pitch_deg)
        cp, sp = math.cos(p), math.sin(p)
        fwd = cp - sp * view.yc  # per row: forward (horizontal) part of the ray through the row's centre
        up = -cp * view.yc - sp
        slope = up / fwd  # rise per metre of the row's ray (rows below the camera's horizon: < 0)
        gap = _PROFILE_M[None, :] * slope[:, None] - profile[None, :]  # ray height above the terrain
        below = gap <= 0.0
        hit = below.any(axis=1) & (fwd > 0)
        k = np.argmax(below, axis=1)
        km1 = np.maximum(k - 1, 0)
        rows = np.arange(cam.height)
        g0, g1 = gap[rows, km1], gap[rows, k]
        t = np.where(k > 0, g0 / np.maximum(g0 - g1, 1e-9), 1.0)
        dist = _PROFILE_M[km1] + t * (_PROFILE_M[k] - _PROFILE_M[km1])
        return dist, hit, fwd, z_cam

    def _render(self, view: _RayView, x: float, y: float, yaw: float, pitch_deg: float, rays: tuple) -> np.ndarray:
        cam = view.cam
        c, s = math.cos(yaw), math.sin(yaw)
        p = math.radians(pitch_deg)
        dist, hit, fwd, z_cam = rays
        frame = np.empty((cam.height, cam.width, 4), np.uint8)
        # sky (and the fog colour below the horizon where no ground is hit within 400 m)
        horizon = cam.cy - cam.f * math.tan(p)
        top = int(round(view.sky_horizon - horizon))
        top = min(max(top, 0), view.sky.shape[0] - cam.height)
        start = int(round(-yaw * cam.f - cam.cx)) % view.pano
        frame[:] = view.sky[top : top + cam.height, start : start + cam.width]
        ground = np.flatnonzero(hit)
        if len(ground):
            r0, r1 = int(ground[0]), int(ground[-1]) + 1  # rows with ground are contiguous (the profile is 1-D)
            d = dist[r0:r1]
            ppm = float(self.to_tex[0, 0])
            ax = ppm * (x + d * c) + self.to_tex[0, 2]
            ay = -ppm * (y + d * s) + self.to_tex[1, 2]
            side = ppm * d / fwd[r0:r1]
            mx = (ax[:, None] + (side * s)[:, None] * view.xc[None, :]).astype(np.float32)
            my = (ay[:, None] + (side * c)[:, None] * view.xc[None, :]).astype(np.float32)
            footprint = d / (cam.f * fwd[r0:r1])  # metres per pixel across
            level = np.where(footprint < 0.15, 0, np.where(footprint < 0.3, 1, 2))
            for lv in (0, 1, 2):
                band = np.flatnonzero(level == lv)
                if not len(band):
                    continue
                a, b = int(band[0]), int(band[-1]) + 1
                scale = 0.5**lv
                bx = mx[a:b] if lv == 0 else (mx[a:b] + 0.5) * scale - 0.5
                by = my[a:b] if lv == 0 else (my[a:b] + 0.5) * scale - 0.5
                cv2.remap(self.mips[lv], bx, by, cv2.INTER_LINEAR, dst=frame[r0 + a : r0 + b],
                          borderMode=cv2.BORDER_CONSTANT, borderValue=self._border)
            w = 1.0 - np.exp(-d / self.palette.fog_distance)
            fogged = np.flatnonzero(w > 1.0 / 255.0)
            if len(fogged):  # rows r0 + fogged[0] .. r1: blend towards the fog colour, one weight per row
                a = int(fogged[0])
                wa = w[a:, None, None]
                mul = cv2.resize(np.round(255 * (1 - wa)).astype(np.uint8).repeat(4, 2), (cam.width, len(wa)),
                                 interpolation=cv2.INTER_NEAREST)
                add = cv2.resize(np.round(wa * view.fog4).astype(np.uint8), (cam.width, len(wa)),
                                 interpolation=cv2.INTER_NEAREST)
                fog_band = frame[r0 + a : r1]
                cv2.multiply(fog_band, mul, dst=fog_band, scale=1.0 / 255.0)
                cv2.add(fog_band, add, dst=fog_band)
        self.objects.draw(frame, view, x, y, z_cam, yaw, p, np.where(hit, dist, np.inf), self.palette)
        return frame


class _RayView:
    """Per-camera-model constants: ray directions of rows and columns, the sky panorama."""

    def __init__(self, cam: CameraModel, pal: Palette, sky_seed: int) -> None:
        self.cam = cam
        self.f, self.cx, self.cy = cam.f, cam.cx, cam.cy
        self.yc = (np.arange(cam.height) - cam.cy) / cam.f
        self.xc = ((np.arange(cam.width) - cam.cx) / cam.f).astype(np.float32)
        self.sky, self.sky_horizon = _sky_panorama(cam, pal, sky_seed)
        self.pano = self.sky.shape[1] // 2
        self.fog4 = np.asarray(tuple(pal.fog) + (0,), np.float32)[None, None, :]


@lru_cache(maxsize=16)
def _sky_panorama(cam: CameraModel, pal: Palette, sky_seed: int) -> tuple[np.ndarray, float]:
    """RGBA sky panorama over elevation angles -_SKY_DEG.._SKY_DEG (camera.py's sky and skyline) and its horizon
    row. Read-only: shared by every renderer with the same camera and palette."""
    half_vfov = math.degrees(math.atan(cam.height / 2 / cam.f))
    span = max(_SKY_DEG, half_vfov + cam.pitch_deg + 8.0)  # the frame's rays at the camera's pitch, +- 8 of hills
    rows = int(round(2 * cam.f * math.tan(math.radians(span))))
    tall = CameraModel(cam.width, rows, cam_height=cam.cam_height, pitch_deg=0.0, hfov_deg=cam.hfov_deg)
    sky = cv2.cvtColor(_sky(tall, pal, np.random.default_rng([sky_seed, 7]), rows), cv2.COLOR_RGB2RGBA)
    sky.flags.writeable = False
    return sky, tall.horizon_row()


def _hood(cam: CameraModel, pal: Palette):
    """The car's hood: a dark, slightly curved shape at the bottom of the frame with a highlight (Udacity's frames
    show it). Returns a function that paints it into an RGBA frame."""
    h, w = cam.height, cam.width
    yy, xx = np.mgrid[h - HOOD_ROWS : h, 0:w]
    u = (xx - cam.cx) / (w / 2)
    edge = h - HOOD_ROWS + 7 * u**2  # the hood's top edge bows down towards the sides
    mask = yy >= edge
    shade = np.clip(0.55 + 0.25 * (1 - u**2) - 0.02 * (yy - (h - HOOD_ROWS)), 0.3, 1.0)
    paint = np.asarray((40, 44, 52), np.float32) * (0.6 + 0.8 * (np.mean(pal.sky_horizon) / 255))
    colour = np.clip(shade[..., None] * paint, 0, 255).astype(np.uint8)
    rgba = np.concatenate([colour, np.full(colour.shape[:2] + (1,), 255, np.uint8)], axis=2)
    mask4 = np.repeat(mask[..., None], 4, axis=2)

    def paint_hood(frame: np.ndarray) -> None:
        np.copyto(frame[h - HOOD_ROWS :], rgba, where=mask4)

    return paint_hood


class _Objects:
    """Upright things beside the road, as vertical quads (base end points, base heights, height, colours).

    kinds: trees (trunk + canopy: two quads), posts every 25 m on both sides, guard rails on the outside of sharp
    bends, rock walls along the inside of the mountain's bends, a few billboards."""

    def __init__(self, track: Track, theme: str, pal: Palette, rng: np.random.Generator) -> None:
        hw = track.half_width
        quads = []  # (x0, y0, x1, y1, height, lift, colour, max_view[, taper])
        right = np.stack([np.sin(track.headings), -np.cos(track.headings)], 1)
        ds = track.ds

        def at(i, lateral):  # lateral from the drawn road's centre (palette.road_shift from the driven line)
            i = int(i) % track.n
            return track.points[i] + (lateral + pal.road_shift) * right[i]

        # posts every 25 m, both sides, white with a dark band
        for i in range(0, track.n, int(round(25 / ds))):
            for side in (-1.0, 1.0):
                b = at(i, side * (hw + pal.verge_width + 0.4))
                h = right[i % track.n] * 0.07
                quads.append((*(b - h), *(b + h), 1.0, 0.0, (235, 235, 230), 60.0))
                quads.append((*(b - h), *(b + h), 0.15, 0.7, (30, 30, 30), 60.0))
        # guard rails on the outside of sharp bends (|curvature| > 1/25 m)
        sharp = np.abs(track.curvature) > 1.0 / 25.0
        step = max(1, int(round(2.0 / ds)))
        for i in range(0, track.n, step):
            if sharp[i]:
                side = -1.0 if track.curvature[i] > 0 else 1.0  # outside of a right-hand bend is on the left
                a, b = at(i, side * (hw + pal.verge_width + 0.3)), at(i + step, side * (hw + pal.verge_width + 0.3))
                quads.append((*a, *b, 0.35, 0.4, (190, 192, 196), 80.0))
        # rock walls (mountain): on the inside of bends, a cliff 3-7 m high just beyond the verge
        if theme == "mountain":
            step = max(1, int(round(3.0 / ds)))
            wall_h = 3.0 + 4.0 * np.abs(np.sin(np.arange(track.n) * ds / 37.0 + rng.uniform(0, 6)))
            for i in range(0, track.n, step):
                if abs(track.curvature[i]) > 1.0 / 60.0:
                    side = 1.0 if track.curvature[i] > 0 else -1.0
                    lat = side * (hw + pal.verge_width + 1.2)
                    shade = 0.75 + 0.25 * rng.random()
                    col = tuple(int(v * shade) for v in pal.rock)
                    quads.append((*at(i, lat), *at(i + step, lat), float(wall_h[i]), 0.0, col, 120.0))
        # trees (mountain: conifers; others: broadleaf), 2 quads each, facing across the road
        n_tree = int(track.length / {"lake": 9.0, "jungle": 3.5, "mountain": 7.0}[theme])
        self.trees = []
        for _ in range(n_tree):
            i = int(rng.integers(track.n))
            side = rng.choice([-1.0, 1.0])
            lat = side * (hw + pal.verge_width + rng.uniform(*pal.tree_lateral))
            b = at(i, lat)
            if np.min(np.hypot(*(track.points[::4] - b).T)) < hw + pal.verge_width + 1.0:
                continue  # too close to another stretch of road
            hgt = rng.uniform(4.0, 11.0) if theme != "lake" else rng.uniform(3.0, 7.0)
            wid = hgt * (0.35 if theme == "mountain" else 0.55)
            t = right[i] * (wid / 2)
            col = pal.tree if rng.random() < 0.5 else pal.tree2
            quads.append((*(b - t * 0.12), *(b + t * 0.12), 0.3 * hgt, 0.0, (70, 52, 36), 150.0))
            quads.append((*(b - t), *(b + t), 0.75 * hgt, 0.25 * hgt, col, 150.0, 1.0 if theme == "mountain" else 0.4))
            self.trees.append((b, wid / 2, hgt))
        # billboards: a few, beside straights
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(track.n))
            side = rng.choice([-1.0, 1.0])
            b = at(i, side * (hw + pal.verge_width + 4.0))
            t = right[i] * 3.0
            quads.append((*(b - t), *(b + t), 2.5, 1.5, tuple(int(v) for v in rng.integers(40, 230, 3)), 150.0))
        q = quads
        self.p0 = np.array([e[0:2] for e in q])
        self.p1 = np.array([e[2:4] for e in q])
        self.height = np.array([e[4] for e in q])
        self.lift = np.array([e[5] for e in q])
        self.colour = np.array([e[6] for e in q], np.float32)
        self.max_view = np.array([e[7] for e in q])
        self.taper = np.array([e[8] if len(e) > 8 else 0.0 for e in q])  # 1: the top edge is a point (a conifer)
        self.base0 = None  # terrain heights, filled by HillsRenderer via bind()
        self._track = track

    def cast_shadows(self, tex: np.ndarray, to_tex: np.ndarray, look: ConditionLook, rng: np.random.Generator) -> None:
        """Darken the texture under the trees' shadows (ellipses thrown away from a sun at a random azimuth)."""
        sun = rng.uniform(0, 2 * np.pi)
        d = np.array([math.cos(sun), math.sin(sun)])
        shade = np.full(tex.shape[:2], 255, np.uint8)
        for b, r, hgt in self.trees:
            c = _pts(np.asarray(b)[None] + d * hgt * look.shadow_length * 0.5, to_tex)[0]
            axes = (int(max(hgt * look.shadow_length * 0.5, r) * PX_PER_M * 8), int(r * PX_PER_M * 8))
            cv2.ellipse(shade, tuple(c), axes, math.degrees(-sun), 0, 360, int(255 * (1 - look.shadow)), -1,
                        cv2.LINE_AA, 3)
        cv2.multiply(tex, cv2.cvtColor(shade, cv2.COLOR_GRAY2RGB), dst=tex, scale=1.0 / 255.0)

    def draw(self, frame: np.ndarray, view: _RayView, x: float, y: float, z_cam: float, yaw: float, pitch: float,
             row_dist: np.ndarray, pal: Palette) -> None:
        """Paint the quads in view, far to near, each cut off where nearer ground hides it (row_dist: the ground
        distance each row sees, inf for sky). Projection, fog and cut-off are vectorised over the quads; only the
        fill is per quad."""
        if self.base0 is None:
            raise RuntimeError("bind() the objects to a heightmap first")
        f, cx, cy, width, height = view.f, view.cx, view.cy, view.cam.width, view.cam.height
        c, s = math.cos(yaw), math.sin(yaw)
        f0 = (self.p0[:, 0] - x) * c + (self.p0[:, 1] - y) * s
        f1 = (self.p1[:, 0] - x) * c + (self.p1[:, 1] - y) * s
        near = np.minimum(f0, f1)
        keep = (near > 1.0) & (np.maximum(f0, f1) < self.max_view)
        idx = np.flatnonzero(keep)
        if not len(idx):
            return
        f0, f1 = f0[idx], f1[idx]
        r0 = (self.p0[idx, 0] - x) * s - (self.p0[idx, 1] - y) * c
        r1 = (self.p1[idx, 0] - x) * s - (self.p1[idx, 1] - y) * c
        cp, sp = math.cos(pitch), math.sin(pitch)
        # corners: base0, top0, top1, base1; the top edge shrinks towards its middle by `taper`
        tp = 0.5 * self.taper[idx]
        fwd = np.stack([f0, f0 + tp * (f1 - f0), f1 - tp * (f1 - f0), f1], 1)
        right = np.stack([r0, r0 + tp * (r1 - r0), r1 - tp * (r1 - r0), r1], 1)
        zb0 = self.base0[idx] + self.lift[idx] - z_cam
        zb1 = self.base1[idx] + self.lift[idx] - z_cam
        hgt = self.height[idx]
        dz = np.stack([zb0, zb0 + hgt, zb1 + hgt, zb1], 1)
        zc = cp * fwd - sp * dz
        u = cx + f * right / zc
        v = cy - f * (sp * fwd + cp * dz) / zc
        dmid = 0.5 * (f0 + f1)
        # the first row (from the top) whose ground is nearer than the object hides everything below it;
        # row_dist does not increase down the frame, so that row is found by a search on the reversed array
        rev = row_dist[::-1]
        bottom = height - np.searchsorted(rev, dmid - 0.5, side="left")
        on = (u.max(1) >= 0) & (u.min(1) < width) & (v.min(1) < bottom) & (v.max(1) - v.min(1) > 1.0)
        on &= (np.abs(u).max(1) < 1e5)
        if not on.any():
            return
        k = np.flatnonzero(on)
        v = np.minimum(v[k], bottom[k, None].astype(np.float64))
        quads = np.round(np.stack([u[k], v], 2) * 8).astype(np.int32)
        w = 1.0 - np.exp(-dmid[k] / pal.fog_distance)
        colours = self.colour[idx[k]] * (1 - w)[:, None] + np.asarray(pal.fog, np.float32)[None] * w[:, None]
        colours = np.concatenate([colours, np.full((len(k), 1), 255.0, np.float32)], 1).tolist()
        for j in np.argsort(-dmid[k]).tolist():
            cv2.fillConvexPoly(frame, quads[j], colours[j], cv2.LINE_AA, 3)

    def bind(self, height_at) -> None:
        self.base0 = height_at(self.p0[:, 0], self.p0[:, 1])
        self.base1 = height_at(self.p1[:, 0], self.p1[:, 1])
