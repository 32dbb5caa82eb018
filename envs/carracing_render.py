"""A fast drop-in for CarRacing-v3's 96x96 `state_pixels` frame, drawn with OpenCV and numpy.

Why: gymnasium draws every observation with anti-aliased pygame polygons on a 1000x800 surface and then
smooth-scales it to 96x96 (about 9 ms a frame), so a rendered env steps ~60x slower than its physics.
`FastRenderer` draws the same picture straight at a small supersampled size and area-averages it down:

* the world (playfield, grass patches, road tiles in their live colours, kerbs, the car's hull and wheels
  with their rotating stripes) in gymnasium's camera (zoom-in during the first second, rotation with the
  car, the car at (1/2, 3/4) of the frame) on a canvas `supersample` times the frame's size. The track's
  polygons are precomputed once per episode in world units; the ones in view (plus a margin, so the set
  is reused while the car moves a few units) are moved by one affine transform per frame and filled
  with one OpenCV call per colour;
* the indicator band (speed, four wheel bars, steering, gyro, score) at the frame's own resolution with
  exact pixel coverage: its bars are integer rectangles in window pixels (cached per rectangle), and the
  score is gymnasium's own font, rendered once per distinct string;
* pygame's smoothscale truncates twice (a flat colour v comes out as v - 2): the frame gets the same.

It only reads the env (Box2D poses, tile colours, `t`, `reward`), so physics, rewards and info are
untouched. `renderer="fast"` in `envs.carracing.make_carracing` uses it; `python -m
benchmarks.carracing_render` measures its speed and its difference from gymnasium's frames.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable

import cv2
import numpy as np
from gymnasium.envs.box2d.car_dynamics import SIZE, WHEEL_R, WHEEL_W
from gymnasium.envs.box2d.car_racing import (
    GRASS_DIM,
    PLAYFIELD,
    SCALE,
    STATE_H,
    STATE_W,
    WINDOW_H,
    WINDOW_W,
    ZOOM,
)

from common.checks import is_int

RENDERERS: tuple[str, ...] = ("pygame", "fast")
LAYERS: tuple[str, ...] = ("grass", "road", "car", "indicators", "score")
_ALL = frozenset(LAYERS)

_SHIFT = 4  # cv2 fixed-point bits for sub-pixel vertices
_ONE = float(1 << _SHIFT)
_KX = STATE_W / WINDOW_W  # frame pixels per window pixel, horizontally (0.096)
_KY = STATE_H / WINDOW_H  # ... and vertically (0.12)
_BAND_TOP = WINDOW_H - 5 * WINDOW_H / 40.0  # 700: top of the black indicator band, window pixels
_BAND_ROW = int(round(_BAND_TOP * _KY))  # 84: first frame row of the band (exact: 700 * 0.12)
_BAND_ROWS = STATE_H - _BAND_ROW
_VIEW_TOP = WINDOW_H - _BAND_TOP  # 100: the view's top edge on the surface before the flip (the band hides the rest)
_VIEW_RADIUS = math.hypot(WINDOW_W / 2, _BAND_TOP / 2)  # window pixels from the view's centre to a corner
_CAR_TO_CORNER = math.hypot(WINDOW_W / 2 + 1, WINDOW_H - WINDOW_H / 4 + 1)  # window pixels, car to a view corner
_VIEW_MARGIN = 6.0  # world units: polygons are culled with this margin, so the set holds while the car moves less
# a road polygon whose centre is this far from the hull may touch the car (its parts reach 3.2 units from the hull's
# origin, a tile's corners 7 units from its centre, the car moves at most ~2 units a step), with a margin
_TOUCH_RADIUS = 15.0
_KERB_GROUP = 1 << 20  # kerbs' colour groups come after every tile colour's

# car_dynamics' colours (the hull's is int(0.8 * 255))
_HULL_COLOR = (204, 0, 0)
_WHEEL_COLOR = (0, 0, 0)
_STRIPE_COLOR = (77, 77, 77)
# the frame rows and columns the car can cover (it sits at window (W/2, 3H/4), at most ~2.6 units from there)
_CAR_ROWS = (64, 80)
_CAR_COLS = (42, 54)
# gymnasium's render_indicators, bar by bar: speed, the four wheels' omega (ABS), steering, gyro
_IND_S, _IND_H = WINDOW_W / 40.0, WINDOW_H / 40.0
_IND_PLACE = (5, 7, 8, 9, 10, 20, 30)
_VBAR_X = [(math.floor(p * _IND_S), math.floor((p + 1) * _IND_S) + 1) for p in _IND_PLACE[:5]]  # pixel columns
_VBAR_FOOT = math.floor(WINDOW_H - _IND_H)  # the vertical bars' fixed end (780)
_HBAR_Y = (math.floor(WINDOW_H - 4 * _IND_H), math.floor(WINDOW_H - 2 * _IND_H) + 1)  # horizontal bars' rows
_IND_GAIN = (0.02, 0.01, 0.01, 0.01, 0.01, -10.0, -0.8)
_IND_COLORS = np.array([(255, 255, 255), (0, 0, 255), (0, 0, 255), (51, 0, 255), (51, 0, 255), (0, 255, 0),
                        (255, 0, 0)], dtype=np.float64)
# smoothscale's fixed-point arithmetic: a flat colour v comes out as max(v - 2, 0) (measured on every v)
_SMOOTHSCALE_LOSS = (2.0, 2.0, 2.0, 0.0)


def _grass_polygons() -> np.ndarray:
    """The 400 grass patches gymnasium draws (its `_render_road` loop), float64[400, 4, 2] world units."""
    g = GRASS_DIM
    return np.asarray([[(g * x + g, g * y), (g * x, g * y), (g * x, g * y + g), (g * x + g, g * y + g)]
                       for x in range(-20, 20, 2) for y in range(-20, 20, 2)], dtype=np.float64)


_GRASS = _grass_polygons()
_FIELD = np.array([[(PLAYFIELD, PLAYFIELD), (PLAYFIELD, -PLAYFIELD), (-PLAYFIELD, -PLAYFIELD),
                    (-PLAYFIELD, PLAYFIELD)]], dtype=np.float64)


def _color(c: Any) -> tuple[int, int, int]:
    """pygame's colour conversion: every channel truncated to an int."""
    return (int(c[0]), int(c[1]), int(c[2]))


class _TrackNeighbourhood:
    """The polygons to draw for one camera neighbourhood: offset world polygons in draw order, and how to fill them."""

    def __init__(self, key: tuple, centre: tuple[float, float], car: tuple[float, float], polys: np.ndarray,
                 n_grass: int, groups: list[tuple[int, int, tuple[int, int, int]]], near: list[int]) -> None:
        self.key, self.centre, self.car = key, centre, car
        self.polys = polys  # [playfield, grass..., road sorted by colour group...] as float[4 n, 1, 2] points
        self.n_grass = n_grass
        self.groups = groups  # (start, end, colour) slices of polys, tile colours before kerbs
        self.near = near  # road polygons that may touch the car while this view holds and may still change colour


class _Track:
    """One episode's polygons in world units (playfield, grass patches, road), bounding circles, road colours.

    Road polygons are grouped by colour (kerbs after every tile colour: gymnasium draws a kerb right after its
    tile and the two only share an edge; polygons of one colour never overlap). gymnasium recolours a tile only
    when the car touches it (FrictionDetector: `tile.color[:] = road_color`), so each frame re-reads the tiles
    near the car that are not in the road colour yet.
    """

    def __init__(self, road_poly: list, road_color: Any) -> None:
        self.road_poly = road_poly
        self.road_rgb = _color(road_color)
        road = np.asarray([p for p, _ in road_poly], dtype=np.float64).reshape(len(road_poly), 4, 2)
        self.n_fixed = 1 + len(_GRASS)  # the playfield, then the grass patches, then the road
        self.polys = np.concatenate([_FIELD, _GRASS, road])
        self.centre = self.polys.mean(axis=1)
        self.radius = np.sqrt(((self.polys - self.centre[:, None, :]) ** 2).sum(-1)).max(1)
        self.radius[0] = np.inf  # the playfield is always drawn (gymnasium does not clip it)
        normals, self.inradius = _outward_normals(self.polys, self.centre)
        # a vertex moves along (n_prev + n_next) / (1 + n_prev . n_next) per unit of edge move (its two edges' normals)
        n_prev = np.roll(normals, 1, axis=1)
        self.vertex_move = (n_prev + normals) / np.maximum(1.0 + np.einsum("nvk,nvk->nv", n_prev, normals),
                                                          0.2)[..., None]
        self._offset_key: tuple[float, float] | None = None
        self._offset = self.polys
        self.colors = [c for _, c in road_poly]  # a tile's colour is the tile's own array
        self.is_tile = [isinstance(c, np.ndarray) for c in self.colors]
        self.palette: list[tuple[int, int, int]] = []
        self._index: dict[tuple[int, int, int], int] = {}
        self.group = np.array([self._group(c, t) for c, t in zip(self.colors, self.is_tile)], dtype=np.int64)
        self.settled = [not t or _color(c) == self.road_rgb for c, t in zip(self.colors, self.is_tile)]
        self.view: _TrackNeighbourhood | None = None

    def _group(self, color: Any, tile: bool) -> int:
        rgb = _color(color)
        i = self._index.get(rgb)
        if i is None:
            i = self._index[rgb] = len(self.palette)
            self.palette.append(rgb)
        return i if tile else i + _KERB_GROUP

    def offset(self, zoom: float, shift: float) -> np.ndarray:
        """Every polygon with its edges moved outward by `shift` world units (inward if negative), for this zoom.

        An inward move never takes more than 45% of a polygon's inradius (tiny polygons when zoomed out).
        """
        if self._offset_key != (zoom, shift):
            self._offset_key = (zoom, shift)
            d = np.maximum(shift, -0.45 * self.inradius)[:, None, None]
            self._offset = self.polys + d * self.vertex_move
        return self._offset

    def visible(self, zoom: float, shift: float, cx: float, cy: float, px: float, py: float,
                layers: frozenset[str]) -> _TrackNeighbourhood:
        """The polygons within the view circle around (cx, cy) (+ a margin), for the car at (px, py); reused while
        the view's centre and the car stay within the margin of where they were, at the same zoom, and no tile
        changed colour."""
        key = (zoom, shift, layers)
        view = self.view
        if (view is not None and view.key == key
                and (cx - view.centre[0]) ** 2 + (cy - view.centre[1]) ** 2 <= _VIEW_MARGIN ** 2
                and (px - view.car[0]) ** 2 + (py - view.car[1]) ** 2 <= _VIEW_MARGIN ** 2):
            if not self._recolor(view):
                return view
        reach = self.radius + (_VIEW_RADIUS / zoom + _VIEW_MARGIN)
        dx, dy = self.centre[:, 0] - cx, self.centre[:, 1] - cy
        vis = dx * dx + dy * dy <= reach * reach
        if "grass" not in layers:
            vis[1:self.n_fixed] = False
        if "road" not in layers:
            vis[self.n_fixed:] = False
        idx = np.flatnonzero(vis)
        n_grass = int(np.searchsorted(idx, self.n_fixed))
        road = idx[n_grass:] - self.n_fixed
        d = self.centre[road + self.n_fixed] - (px, py)
        near_mask = np.einsum("ij,ij->i", d, d) <= (_TOUCH_RADIUS + _VIEW_MARGIN) ** 2
        near = [i for i in road[near_mask].tolist() if not self.settled[i]]
        for i in near:  # current colours before grouping
            self.group[i] = self._group(self.colors[i], True)
        order = road[np.argsort(self.group[road], kind="stable")]
        sorted_groups = self.group[order]
        bounds = [0] + (np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1).tolist() + [len(order)]
        groups = [(n_grass + a, n_grass + b, self.palette[int(sorted_groups[a]) % _KERB_GROUP])
                  for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        polys = self.offset(zoom, shift)[np.concatenate([idx[:n_grass], order + self.n_fixed])].reshape(-1, 1, 2)
        self.view = _TrackNeighbourhood(key, (cx, cy), (px, py), polys, n_grass, groups, near)
        return self.view

    def _recolor(self, view: _TrackNeighbourhood) -> bool:
        """Re-read the colours of the view's tiles near the car; True if one changed (the grouping is stale)."""
        changed = False
        for i in view.near:
            if not self.settled[i]:
                g = self._group(self.colors[i], True)
                if g != self.group[i]:
                    self.group[i] = g
                    changed = True
                self.settled[i] = self.palette[g] == self.road_rgb
        return changed


class _CarShape:
    """The car's polygons in body coordinates (read once per car: Box2D may reorder a polygon's vertices)."""

    def __init__(self, car: Any) -> None:
        self.car = car
        self.hull = [np.asarray(f.shape.vertices, dtype=np.float64) for f in car.hull.fixtures]
        # each wheel as its centre-to-side and centre-to-tip half extents, in wheel coordinates (x right, y forward)
        self.wheel_half: list[tuple[float, float]] = []
        for w in car.wheels:
            v = np.asarray(w.fixtures[0].shape.vertices, dtype=np.float64)
            self.wheel_half.append((float(np.abs(v[:, 0]).max()), float(np.abs(v[:, 1]).max())))
        self.hull_zoom = math.nan  # the hull's polygons on the car's canvas depend on the zoom only: cached
        self.hull_pts: list[np.ndarray] = []


class FastRenderer:
    """Draws CarRacing-v3's `state_pixels` frame (uint8[96, 96, 3]) from the env's state, without pygame surfaces.

    supersample: the world is drawn at supersample x 96 pixels, then area-averaged; powers of two take OpenCV's
    fast halving path (2 already stays well within one grey level of gymnasium's frame on average).
    car_supersample: the same for the car, which is a few pixels big and has a canvas of its own.
    """

    def __init__(self, supersample: int = 2, car_supersample: int = 4) -> None:
        for name, value in (("supersample", supersample), ("car_supersample", car_supersample)):
            if not is_int(value, 1, 8):
                raise ValueError(f"{name} must be an int in [1, 8], got {value!r}")
        self.supersample = supersample
        self.car_supersample = car_supersample
        k = car_supersample
        self._car_grow = ((0.5 * _KX * k - 0.5) * _ONE, (0.5 * _KY * k - 0.5) * _ONE)
        self._w = STATE_W * supersample
        self._h = _BAND_ROW * supersample
        self._canvas = np.zeros((self._h, self._w, 3), dtype=np.uint8)
        # pygame fills every window pixel its (truncated) polygon touches, cv2 every canvas pixel whose centre is
        # within half a pixel of the polygon: the net outward edge move, in canvas pixels per axis (negative: in)
        self._grow = np.array([0.5 * _KX * supersample - 0.5, 0.5 * _KY * supersample - 0.5])
        self._grow_mean = float(self._grow.mean())
        self._bg_color: tuple[int, int, int] | None = None
        self._bg = self._canvas
        self._track: _Track | None = None
        self._car: _CarShape | None = None
        self._font: Any = None
        self._grey_ramp: bool | None = None
        self._score_cache: dict[str, tuple[int, int, np.ndarray, np.ndarray]] = {}
        self._bar_cache: dict[tuple, np.ndarray] = {}  # coverage vectors of bar rows / columns

    # ------------------------------------------------------------------------------------------- public
    def render(self, env: Any, layers: Iterable[str] | None = None) -> np.ndarray | None:
        """The 96x96x3 frame gymnasium's `_render("state_pixels")` would return (None before the first reset).

        layers: what to draw, a subset of LAYERS, None = all (tests leave one out to see that it is drawn at all).
        """
        if layers is None:
            todo = _ALL
        else:
            todo = frozenset(layers)
            if not todo <= _ALL:
                raise ValueError(f"layers must be a subset of {LAYERS}, got unknown {sorted(todo - _ALL)}")
        if "t" not in env.__dict__ or env.car is None:
            return None  # reset() not called yet, as in gymnasium
        if self._track is None or self._track.road_poly is not env.road_poly:
            self._track = _Track(env.road_poly, env.road_color)
        if self._car is None or self._car.car is not env.car:
            self._car = _CarShape(env.car)

        out = np.empty((STATE_H, STATE_W, 3), dtype=np.uint8)
        out[:_BAND_ROW] = self._world(env, todo)
        band = np.zeros((_BAND_ROWS, STATE_W, 3))
        if "indicators" in todo:
            self._indicators(env, out, band)
        if "score" in todo:
            self._score(float(env.reward), band)
        band += 0.5  # the cast below then rounds (every value is >= 0)
        out[_BAND_ROW:] = band
        # saturating: max(v - 2, 0); cv2 takes a scalar as src2, which its stubs do not say
        return cv2.subtract(out, _SMOOTHSCALE_LOSS)  # type: ignore[call-overload]

    # ------------------------------------------------------------------------------------------- world
    def _world(self, env: Any, layers: frozenset[str]) -> np.ndarray:
        """Playfield, grass, road and car above the band: supersampled polygons, area-averaged to 84x96."""
        tr, shape = self._track, self._car
        assert tr is not None and shape is not None
        hull = shape.car.hull
        t = env.t
        zoom = 0.1 * SCALE * max(1 - t, 0) + ZOOM * SCALE * min(t, 1)
        pos = hull.position
        px, py = pos[0], pos[1]
        ang = -hull.angle
        c, s = math.cos(ang), math.sin(ang)
        ax, ay = _KX * self.supersample, _KY * self.supersample  # canvas pixels per window pixel
        # world -> window: zoom * R(ang) (w - pos) + (W/2, H/4), then flipped vertically (y -> H - y), then scaled
        # to the canvas; -0.5 moves from pixel-area to cv2's pixel-centre coordinates; x16 for cv2's fixed point
        # (+ 0.5: the cast to int below truncates; only points left of or above the canvas round the other way)
        zx, zy = zoom * ax * _ONE, zoom * ay * _ONE
        mat = np.array([[c * zx, -s * zx, (ax * (WINDOW_W / 2 - zoom * (c * px - s * py)) - 0.5) * _ONE + 0.5],
                        [-s * zy, -c * zy, (ay * (WINDOW_H - WINDOW_H / 4 + zoom * (s * px + c * py)) - 0.5) * _ONE
                         + 0.5]])
        # the net edge move (self._grow) in world units, applied to the polygons once per zoom
        shift = self._grow_mean / (zoom * 0.5 * (ax + ay))
        # the view above the band as a circle in world units: its centre is window (W/2, BAND_TOP/2) before the flip
        dy = (WINDOW_H - _BAND_TOP / 2 - WINDOW_H / 4) / zoom
        view = tr.visible(zoom, shift, px + s * dy, py + c * dy, px, py, layers)
        pts = cv2.transform(view.polys, mat).astype(np.int32).reshape(-1, 4, 2)  # (far faster than numpy's matmul)

        canvas = self._canvas
        bg = _color(env.bg_color)
        if self._view_in_field(zoom, px, py, c, s):  # the usual case: the playfield covers the whole view
            if self._bg_color != bg:  # a canvas-sized copy is far faster than numpy broadcasting 3 channels
                self._bg_color = bg
                self._bg = np.empty_like(canvas)
                cv2.rectangle(self._bg, (0, 0), (self._w, self._h), bg, thickness=-1)
            np.copyto(canvas, self._bg)
        else:
            canvas.fill(0)  # the surface's black around the playfield
            cv2.fillConvexPoly(canvas, pts[0], bg, lineType=cv2.LINE_8, shift=_SHIFT)
        # fillPoly takes the polygons as one array [n, k, 2]; cv2's stubs ask for a sequence of arrays (call-overload)
        if view.n_grass > 1:  # the patches never overlap: one call (cv2's even-odd rule is then harmless)
            cv2.fillPoly(canvas, pts[1:view.n_grass], _color(env.grass_color),  # type: ignore[call-overload]
                         lineType=cv2.LINE_8, shift=_SHIFT)
        for start, end, color in view.groups:
            cv2.fillPoly(canvas, pts[start:end], color, lineType=cv2.LINE_8, shift=_SHIFT)  # type: ignore[call-overload]
        world = _area_down(canvas, self.supersample)
        if "car" in layers:
            self._draw_car(world, shape, zoom)
        return world

    @staticmethod
    def _view_in_field(zoom: float, px: float, py: float, c: float, s: float) -> bool:
        """Whether the view's four corners (window x in [0, W], y in [VIEW_TOP, H] before the flip, one pixel of
        margin) lie on the playfield."""
        if max(abs(px), abs(py)) + _CAR_TO_CORNER / zoom < PLAYFIELD:  # far from the edges at any rotation
            return True
        for wx, wy in ((-1.0, _VIEW_TOP - 1), (WINDOW_W + 1.0, _VIEW_TOP - 1), (-1.0, WINDOW_H + 1.0),
                       (WINDOW_W + 1.0, WINDOW_H + 1.0)):
            u, v = (wx - WINDOW_W / 2) / zoom, (wy - WINDOW_H / 4) / zoom  # window = zoom * R(ang) (w - pos) + ...
            x, y = px + c * u + s * v, py - s * u + c * v
            if abs(x) >= PLAYFIELD or abs(y) >= PLAYFIELD:
                return False
        return True

    def _draw_car(self, world: np.ndarray, shape: _CarShape, zoom: float) -> None:
        """Wheels (black, with the grey stripe that shows their rotation), then the hull's four polygons, over the
        area-averaged world.

        The car is a few pixels big, so it gets its own finer canvas (`car_supersample` x) over the frame rows and
        columns it can reach, drawn over the world's pixels there and area-averaged back. The camera follows the hull,
        so the hull never moves there (only the zoom changes it: its pixels are cached) and a wheel is its pose relative
        to the hull; a handful of points, computed in plain Python.
        """
        k = self.car_supersample
        ax, ay = _KX * k, _KY * k  # patch pixels per window pixel
        zx, zy = zoom * ax * _ONE, zoom * ay * _ONE  # fixed-point patch pixels per world unit
        x0 = (ax * WINDOW_W / 2 - _CAR_COLS[0] * k - 0.5) * _ONE  # the hull's origin on the patch, fixed point
        y0 = (ay * (WINDOW_H - WINDOW_H / 4) - _CAR_ROWS[0] * k - 0.5) * _ONE
        gx, gy = self._car_grow
        region = world[_CAR_ROWS[0]:_CAR_ROWS[1], _CAR_COLS[0]:_CAR_COLS[1]]
        # the world under the car, each frame pixel as a k x k block: area-averaging the car drawn over it is exactly
        # the car laid over the world with its pixel coverage
        patch = cv2.resize(region, (region.shape[1] * k, region.shape[0] * k), interpolation=cv2.INTER_NEAREST)
        car = shape.car
        hull = car.hull
        th = hull.angle
        hp = hull.position
        px, py = hp[0], hp[1]
        ct, st = math.cos(th), math.sin(th)
        wheel_pts: list[int] = []
        stripe_pts: list[int] = []
        sw = WHEEL_W * SIZE  # the stripe's half width (the wheel's)
        for w, (hw, hr) in zip(car.wheels, shape.wheel_half):
            wp = w.position
            dx, dy = wp[0] - px, wp[1] - py
            phi = w.angle - th
            cf, sf = math.cos(phi), math.sin(phi)
            # the wheel's centre, then its right and forward axes on the canvas (y flipped), fixed point
            ox, oy = x0 + zx * (ct * dx + st * dy), y0 - zy * (ct * dy - st * dx)
            rx, ry, fx, fy = zx * cf, -zy * sf, -zx * sf, -zy * cf
            # half extents as canvas vectors; the edge offset (gx, gy) pushes each corner out along its own side
            ax_, ay_ = hw * rx, hw * ry
            bx_, by_ = hr * fx, hr * fy
            wheel_pts += (round(ox - ax_ - bx_ - gx), round(oy - ay_ - by_ + gy),
                          round(ox + ax_ - bx_ + gx), round(oy + ay_ - by_ + gy),
                          round(ox + ax_ + bx_ + gx), round(oy + ay_ + by_ - gy),
                          round(ox - ax_ + bx_ - gx), round(oy - ay_ + by_ - gy))
            # car_dynamics' stripe: from wheel height cos(phase) to cos(phase + 1.2), hidden when both sines are
            # positive, a positive sine clamping its end to the wheel's tip
            a1 = w.phase
            a2 = a1 + 1.2
            s1, s2 = math.sin(a1), math.sin(a2)
            if s1 > 0 and s2 > 0:
                continue
            c1 = math.cos(a1) if s1 <= 0 else _sign(math.cos(a1))
            c2 = math.cos(a2) if s2 <= 0 else _sign(math.cos(a2))
            up = _sign(c1 - c2) * gy  # the end nearer the wheel's tip moves up the canvas (y flipped)
            ax_, ay_ = sw * rx, sw * ry
            y1, y2 = WHEEL_R * SIZE * c1, WHEEL_R * SIZE * c2
            e1x, e1y, e2x, e2y = ox + y1 * fx, oy + y1 * fy - up, ox + y2 * fx, oy + y2 * fy + up
            stripe_pts += (round(e1x - ax_ - gx), round(e1y - ay_), round(e1x + ax_ + gx), round(e1y + ay_),
                           round(e2x + ax_ + gx), round(e2y + ay_), round(e2x - ax_ - gx), round(e2y - ay_))
        # one array of polygons [n, 4, 2], which cv2's stubs do not allow (call-overload)
        cv2.fillPoly(patch, np.array(wheel_pts, dtype=np.int32).reshape(-1, 4, 2),  # type: ignore[call-overload]
                     _WHEEL_COLOR, lineType=cv2.LINE_8, shift=_SHIFT)
        if stripe_pts:
            cv2.fillPoly(patch, np.array(stripe_pts, dtype=np.int32).reshape(-1, 4, 2),  # type: ignore[call-overload]
                         _STRIPE_COLOR, lineType=cv2.LINE_8, shift=_SHIFT)
        if shape.hull_zoom != zoom:  # the hull's polygons on the patch, once per zoom
            shape.hull_zoom = zoom
            shape.hull_pts = []
            for local in shape.hull:
                pts = np.stack([x0 + zx * local[:, 0], y0 - zy * local[:, 1]], axis=1)
                pts += np.sign(pts - pts.mean(axis=0)) * (gx, gy)
                shape.hull_pts.append(np.rint(pts).astype(np.int32))
        for pts in shape.hull_pts:  # they overlap: one fill each
            cv2.fillConvexPoly(patch, pts, _HULL_COLOR, lineType=cv2.LINE_8, shift=_SHIFT)
        region[:] = _area_down(patch, k)

    # ------------------------------------------------------------------------------------------- indicator band
    def _indicators(self, env: Any, out: np.ndarray, band: np.ndarray) -> None:
        """gymnasium's `_render_indicators`: bars on the black band, with exact area coverage.

        On the black band the bars just add up, each the outer product of its per-row and per-column coverage (times
        its colour). A vertical bar's columns never change, only its rows; a horizontal bar's rows never change,
        only its columns: so the band is one small matrix product of cached coverage vectors. Neighbouring wheel
        bars share one window-pixel column, owned by the later one (the earlier one's colour is taken off it again).
        Rarer layouts (a horizontal bar reaching another bar, a bar taller than the band) are painted one by one.
        """
        car = env.car
        hull = car.hull
        wheels = car.wheels
        vel = hull.linearVelocity
        vx, vy = vel[0], vel[1]
        values = (math.sqrt(vx * vx + vy * vy), float(wheels[0].omega), float(wheels[1].omega),  # plain floats: fast
                  float(wheels[2].omega), float(wheels[3].omega), wheels[0].joint.angle, hull.angularVelocity)
        # gymnasium's vertical_ind / horiz_ind polygons as the pixels pygame.draw.polygon fills: from the truncated
        # min to the truncated max, both included, clipped to the surface
        H, h, s = float(WINDOW_H), _IND_H, _IND_S
        spans: list[tuple[int, int] | None] = [None] * 7  # rows of the vertical bars, columns of the horizontal ones
        for i in range(5):
            value = values[i]
            if abs(value) > 1e-4:  # gymnasium's render_if_min
                top = math.floor(H - (h + h * (_IND_GAIN[i] * value)))
                if top <= _VBAR_FOOT:
                    spans[i] = (max(top, 0), _VBAR_FOOT + 1)
                else:  # a negative value: the bar hangs below H - h
                    spans[i] = (_VBAR_FOOT, min(top + 1, WINDOW_H))
        for i in (5, 6):
            value = values[i]
            if abs(value) > 1e-4:
                xa, xb = (_IND_PLACE[i] + 0) * s, (_IND_PLACE[i] + _IND_GAIN[i] * value) * s
                x0, x1 = max(math.floor(min(xa, xb)), 0), min(math.floor(max(xa, xb)) + 1, WINDOW_W)
                if x1 > x0:
                    spans[i] = (x0, x1)
        vert_end = max((_VBAR_X[i][1] for i in range(5) if spans[i] is not None), default=-1)
        steer, gyro = spans[5], spans[6]
        simple = (all(q is None or q[0] >= _BAND_TOP for q in spans[:5])
                  and all(q is None or q[0] >= vert_end for q in (steer, gyro))
                  and (steer is None or gyro is None or steer[1] <= gyro[0] or gyro[1] <= steer[0]))
        if not simple:
            rects = [(_VBAR_X[i][0], _VBAR_X[i][1]) + q if i < 5 else q + _HBAR_Y
                     for i, q in enumerate(spans) if q is not None]
            self._paint_bars(rects, [i for i, q in enumerate(spans) if q is not None], out, band)
            return
        cache = self._bar_cache
        if len(cache) > 16384:
            cache.clear()
        rows = []
        for j in range(8):  # the five vertical bars, then the column wheel bar j shares with wheel bar j + 1 (j = 1..3)
            if j < 5:
                q = spans[j]
            else:
                a, b = spans[j - 4], spans[j - 3]
                q = (max(a[0], b[0]), min(a[1], b[1])) if a is not None and b is not None else None
            if q is None or q[1] <= q[0]:
                rows.append(_ZERO_ROWS)
                continue
            vec = cache.get(q)
            if vec is None:
                vec = cache[q] = _band_rows(*q)
            rows.append(vec)
        flat = band.reshape(_BAND_ROWS, -1)
        flat += np.array(rows).T @ _VBAR_COLS
        hcols = None
        for i, q in ((5, steer), (6, gyro)):
            if q is None:
                continue
            vec = cache.get((i, q))
            if vec is None:
                vec = cache[(i, q)] = _band_cols(*q, _IND_COLORS[i])
            hcols = vec if hcols is None else hcols + vec
        if hcols is not None:
            flat += np.multiply.outer(_HBAR_ROWS, hcols)

    @staticmethod
    def _paint_bars(rects: list[tuple[int, int, int, int]], which: list[int], out: np.ndarray,
                    band: np.ndarray) -> None:
        """Bars painted one over the other, over the world where they reach above the band (rare layouts)."""
        frame = np.concatenate([out[:_BAND_ROW].astype(np.float64), band])
        for (x0, x1, y0, y1), i in zip(rects, which):
            r0, cy = _cover(y0 * _KY, y1 * _KY)
            c0, cx = _cover(x0 * _KX, x1 * _KX)
            cov = np.multiply.outer(cy, cx)[..., None]
            block = frame[r0:r0 + len(cy), c0:c0 + len(cx)]
            block += (_IND_COLORS[i] - block) * cov
        out[:_BAND_ROW] = np.rint(frame[:_BAND_ROW])
        band[:] = frame[_BAND_ROW:]

    def _score(self, reward: float, band: np.ndarray) -> None:
        """The score digits (white on a black box), gymnasium's font and place, area-averaged once per string."""
        text = f"{reward:04.0f}"
        cached = self._score_cache.get(text)
        if cached is None:
            if len(self._score_cache) > 4096:
                self._score_cache.clear()
            cached = self._score_cache[text] = self._score_patch(text)
        c0, c1, keep, patch = cached
        block = band[:, c0:c1]
        block *= keep
        block += patch

    def _score_patch(self, text: str) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(first and last + 1 frame column of the text box, 1 - its coverage float[12, n, 1], its text over black
        float[12, n, 1]) for the band, from pygame's own rendering of the string."""
        import pygame

        if self._font is None:
            pygame.font.init()
            self._font = pygame.font.Font(pygame.font.get_default_font(), 42)
        surf = self._font.render(text, True, (255, 255, 255), (0, 0, 0))
        rect = surf.get_rect()
        rect.center = (60, WINDOW_H - WINDOW_H * 2.5 / 40.0)  # gymnasium's placement
        if self._grey_ramp is None:
            self._grey_ramp = surf.get_bitsize() == 8 and _grey_palette(surf)
        if self._grey_ramp:  # the usual 8-bit surface whose palette is a grey ramp: the index is the grey level
            grey = np.frombuffer(pygame.image.tobytes(surf, "P"), dtype=np.uint8).reshape(rect.h, rect.w)
        else:
            grey = pygame.surfarray.array3d(surf)[:, :, 0].T
        c0, c1, wy, wx, keep = _box_weights(rect.x, rect.y, rect.w, rect.h)
        patch = wy @ grey.astype(np.float64) @ wx.T
        return c0, c1, keep, patch[..., None]


# ----------------------------------------------------------------------------------------------- helpers
def _sign(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else 0.0


def _area_down(canvas: np.ndarray, factor: int) -> np.ndarray:
    """Average factor x factor blocks; powers of two go through OpenCV's fast exact halving."""
    img = canvas
    while factor > 1 and factor % 2 == 0:
        img = cv2.resize(img, (img.shape[1] // 2, img.shape[0] // 2), interpolation=cv2.INTER_AREA)
        factor //= 2
    if factor > 1:
        img = cv2.resize(img, (img.shape[1] // factor, img.shape[0] // factor), interpolation=cv2.INTER_AREA)
    return img


def _cover(a: float, b: float) -> tuple[int, np.ndarray]:
    """First pixel and per-pixel covered fraction of the interval [a, b) in pixel units."""
    i0, i1 = math.floor(a), math.ceil(b)
    return i0, np.array([min(b, j + 1) - max(a, j) for j in range(i0, i1)])


def _grey_palette(surf: Any) -> bool:
    """Whether an 8-bit surface's palette maps index i to grey (i, i, i) (pygame's shaded text, white on black)."""
    pal = surf.get_palette()
    return len(pal) == 256 and all(tuple(pal[i])[:3] == (i, i, i) for i in range(256))


@functools.lru_cache(maxsize=64)
def _box_weights(x: int, y: int, w: int, h: int) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """For a w x h box at window (x, y) in the band: its frame columns [c0, c1), the row and column area weights
    (float[12, h], float[c1 - c0, w]) and 1 - the box's coverage float[12, c1 - c0, 1] (cached: digits share boxes)."""
    wy = _weights(y - _BAND_TOP, h, _KY, _BAND_ROWS)
    c0, c1 = max(math.floor(x * _KX), 0), min(math.ceil((x + w) * _KX), STATE_W)
    wx = _weights(x - c0 / _KX, w, _KX, c1 - c0)
    keep = 1.0 - np.multiply.outer(wy.sum(1), wx.sum(1))[..., None]
    for a in (wy, wx, keep):
        a.flags.writeable = False
    return c0, c1, wy, wx, keep


def _weights(start: float, n: int, scale: float, m: int) -> np.ndarray:
    """float[m, n]: the share of frame pixel i (of m, spanning [i, i+1) / scale) covered by the unit interval
    [start + j, start + j + 1) (n of them, window pixels), times scale: area-averaging weights."""
    a = start + np.arange(n, dtype=np.float64)
    edges = np.arange(m + 1, dtype=np.float64)[:, None] / scale
    return np.maximum(np.minimum(a + 1, edges[1:]) - np.maximum(a, edges[:-1]), 0.0) * scale


def _band_rows(y0: int, y1: int) -> np.ndarray:
    """float[12]: the share of each band row covered by window rows [y0, y1)."""
    rows = np.zeros(_BAND_ROWS)
    r0, cy = _cover(y0 * _KY, y1 * _KY)
    rows[r0 - _BAND_ROW:r0 - _BAND_ROW + len(cy)] = cy
    return rows


def _band_cols(x0: int, x1: int, color: np.ndarray) -> np.ndarray:
    """float[96 * 3]: the share of each frame column covered by window columns [x0, x1), times a colour."""
    cols = np.zeros((STATE_W, 3))
    c0, cx = _cover(x0 * _KX, x1 * _KX)
    cols[c0:c0 + len(cx)] = np.multiply.outer(cx, color)
    return cols.ravel()


def _outward_normals(polys: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit outward normals of every edge (vertex i to i+1) of convex polygons float[n, m, 2], and their inradii
    (the smallest distance from the centre to an edge's line)."""
    edge = np.roll(polys, -1, axis=1) - polys
    normal = np.stack([edge[..., 1], -edge[..., 0]], axis=-1)
    length = np.linalg.norm(normal, axis=-1, keepdims=True)
    normal = np.divide(normal, length, out=np.zeros_like(normal), where=length > 1e-12)
    dist = np.einsum("nvk,nvk->nv", normal, polys - centres[:, None, :])  # centre-to-edge-line, signed
    normal *= np.where(dist < 0, -1.0, 1.0)[..., None]
    return normal, np.where(length[..., 0] > 1e-12, np.abs(dist), np.inf).min(axis=1)


_ZERO_ROWS = np.zeros(_BAND_ROWS)
# the vertical bars' columns times their colours, then the three shared wheel-bar columns times minus the earlier
# bar's colour (what the later bar paints over)
_VBAR_COLS = np.stack([_band_cols(*_VBAR_X[i], _IND_COLORS[i]) for i in range(5)]
                      + [_band_cols(_VBAR_X[j + 1][0], _VBAR_X[j][1], -_IND_COLORS[j]) for j in (1, 2, 3)])
_HBAR_ROWS = _band_rows(*_HBAR_Y)
