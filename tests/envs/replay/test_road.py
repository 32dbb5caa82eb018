"""The road's middle measured on frames (envs/replay/road.py): lines drawn at known ground positions are found
where they were drawn, a frame without both sides says so, and the time series is cleaned and filled."""
from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from envs.replay.road import RoadEstimator, one_sided, plausible, smooth_middle
from envs.replay.spec import REAL_UDACITY, SIM_V0

YELLOW, WHITE, ASPHALT = (200, 170, 40), (245, 245, 245), (110, 110, 105)
FADED = (125, 120, 85)  # a worn yellow line: too pale for the bright test, more saturated than the asphalt


def _frame(geometry, lines, colour, slope=0.0, curve=0.0, verge=None):
    """A grey road frame with lines (y right of the camera, m) drawn on the flat ground, each
    ``y + slope x + curve x^2`` from 1 to 40 m ahead, 0.15 m wide, as the geometry's camera sees them."""
    cam = geometry.model()
    frame = np.zeros((geometry.height, geometry.width, 3), np.uint8)
    frame[int(math.ceil(cam.horizon_row())):] = ASPHALT
    to_image = cam.ground_to_image(0.0, 0.0, 0.0)
    xs = np.linspace(1.0, 40.0, 400)
    if verge is not None:  # (y from, y to, colour): a wide strip of ground, not a line
        outline = np.concatenate([np.stack([xs, np.full(400, verge[0])], 1),
                                  np.stack([xs, np.full(400, verge[1])], 1)[::-1]])
        px = to_image @ np.stack([outline[:, 0], -outline[:, 1], np.ones(len(outline))])
        cv2.fillPoly(frame, [np.round((px[:2] / px[2]).T * 16).astype(np.int32)], verge[2], cv2.LINE_AA, shift=4)
    for y in lines:
        centre = y + slope * xs + curve * xs ** 2
        outline = np.concatenate([np.stack([xs, centre - 0.075], 1), np.stack([xs, centre + 0.075], 1)[::-1]])
        ground = np.stack([outline[:, 0], -outline[:, 1], np.ones(len(outline))])  # the camera's y is left
        px = to_image @ ground
        cv2.fillPoly(frame, [np.round((px[:2] / px[2]).T * 16).astype(np.int32)], colour, cv2.LINE_AA, shift=4)
    return frame


@pytest.mark.parametrize("geometry,lines,colour,slope", [
    (REAL_UDACITY, (-2.5, 3.5), YELLOW, 0.0),  # the lake: yellow edges, driver 0.5 m left of the middle
    (REAL_UDACITY, (-3.4, 2.6), YELLOW, 0.04),  # right of the middle, turned 2.3 degrees off the road
    (REAL_UDACITY, (-1.6, 2.4), WHITE, 0.0),  # the jungle's lane: white centre line and edge
    (SIM_V0, (-1.5, 2.0), WHITE, -0.03),  # this project's camera
])
def test_two_lines_at_known_ground_positions_give_their_middle_and_width(geometry, lines, colour, slope):
    est = RoadEstimator(geometry)
    reading = est.measure(_frame(geometry, lines, colour, slope))
    # edges nearest the car: the lines' inner edges (less a pixel of blur on each side); the middle and width at
    # ``at_m`` ahead (the slope moves both)
    inner = (lines[0] + 0.075, lines[1] - 0.075)
    assert reading.middle_m == pytest.approx(0.5 * sum(inner) + slope * est.at, abs=0.06)
    assert reading.width_m == pytest.approx(inner[1] - inner[0], abs=0.2)


def test_a_faded_yellow_line_is_a_line_and_a_yellowish_verge_is_not():
    est = RoadEstimator(REAL_UDACITY)
    reading = est.measure(_frame(REAL_UDACITY, (-2.5, 3.5), FADED))
    assert reading.middle_m == pytest.approx(0.5, abs=0.06)
    # a faded left line, and on the right a 4 m strip of pale yellow sand instead of a line: no right boundary
    sand = est.measure(_frame(REAL_UDACITY, (-2.5,), FADED, verge=(3.5, 7.5, FADED)))
    assert math.isnan(sand.middle_m) and math.isnan(sand.right_m) and sand.left_m == pytest.approx(-2.425, abs=0.1)


def test_a_bend_keeps_the_middle():
    est = RoadEstimator(REAL_UDACITY)
    reading = est.measure(_frame(REAL_UDACITY, (-3.2, 2.8), YELLOW, curve=0.015))
    assert reading.middle_m == pytest.approx(-0.2 + 0.015 * est.at ** 2, abs=0.08)


def test_a_frame_with_one_side_or_an_implausible_width_has_no_middle():
    est = RoadEstimator(REAL_UDACITY)
    one = est.measure(_frame(REAL_UDACITY, (2.5,), YELLOW))
    assert math.isnan(one.middle_m) and one.right_m == pytest.approx(2.425, abs=0.1) and math.isnan(one.left_m)
    assert math.isnan(est.measure(_frame(REAL_UDACITY, (-0.6, 0.7), YELLOW)).middle_m)  # narrower than a car
    blank = np.zeros((160, 320, 3), np.uint8)
    blank[70:] = ASPHALT
    assert math.isnan(est.measure(blank).middle_m)


def test_off_width_frames_are_dropped_and_the_series_smoothed_filled_and_zero_where_unknown():
    readings = np.full((60, 4), np.nan)
    readings[:20, :2] = (0.4, 6.0)
    readings[5, :2] = (2.0, 8.5)  # a wrong line on one side: the width says so
    readings[30:40, :2] = (-0.2, 6.1)
    kept = plausible(readings)
    assert math.isnan(kept[5, 0]) and kept[4, 0] == 0.4
    middle = smooth_middle(kept[:, 0], window=5, max_gap=10)
    assert np.allclose(middle[:20], 0.4)  # the dropped frame is filled from its neighbours
    assert middle[25] == pytest.approx(0.4 + (-0.2 - 0.4) * (25 - 19) / (30 - 19))  # a 10-frame gap is bridged
    assert np.all(middle[40:] == 0.0)  # nothing known after it: the driver's own line
    assert np.all(smooth_middle(np.full(10, np.nan)) == 0.0)


def test_one_boundary_gives_the_middle_when_it_continues_the_boundary_seen_before():
    readings = np.full((50, 4), np.nan)
    readings[:10] = (0.0, 6.0, -3.0, 3.0)  # both boundaries: a 6 m road, the car in its middle
    readings[10:15, 3] = 3.2  # the right one alone, where it was: the middle 3 m left of it
    readings[15, 3] = 4.5  # a lone line 1.5 m further out: another line, not the boundary
    readings[16, 2] = -2.8  # the left one alone
    readings[45, 3] = 3.0  # alone, but 36 frames after both were last seen
    readings[20, 2] = 1.0  # a "left" boundary right of the car
    out = one_sided(readings)
    np.testing.assert_allclose(out[10:15, 0], 0.2)
    assert out[16, 0] == pytest.approx(0.2)
    assert np.isnan(out[15, 0]) and np.isnan(out[45, 0]) and np.isnan(out[20, 0])
    np.testing.assert_array_equal(out[:10], readings[:10])
    assert np.isnan(one_sided(np.full((5, 4), np.nan))).all()
