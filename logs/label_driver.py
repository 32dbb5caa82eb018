"""Interventions per 100 s of drivers that need no frames, on the held-out 20 % of each recording: the recorded
steering, its centred 0.5 s average (what the student is trained to predict), its trailing 0.5 s average, straight."""
import sys, numpy as np
from agent.data.labels import centred_average
from driving_data.dataset import open_dataset
from envs.replay.spec import replay_parts, geometry_of
from envs.replay.vehicle import PathVehicle, count_interventions, DEFAULT_MAX_OFFSET_M, DEFAULT_MAX_YAW_RAD
from envs.replay.road import part_middle
from envs.replay.env import MAX_STEP_S

def trailing(t, y, w=0.5):
    out = np.empty_like(y)
    for i in range(len(y)):
        lo = np.searchsorted(t, t[i] - w, side="left"); out[i] = y[lo:i + 1].mean()
    return out

span = (0.8, 1.0)
for path in sys.argv[1:]:
    ds = open_dataset(path); g = geometry_of(ds); veh = PathVehicle.of(g)
    tot = {}; T = 0.0
    for ref in ("driver", "driver-or-middle"):
        for p in replay_parts(ds, span):
            a = ds.load(p.episode, keys=["action", "speed", "time"])
            full_t = np.asarray(a["time"], np.float64); full_s = np.asarray(a["action"], np.float64).reshape(len(full_t), -1)[:, 0]
            rows = slice(p.start, p.stop)
            s, v, t = full_s[rows], np.asarray(a["speed"], np.float64)[rows], full_t[rows]
            dt = np.clip(np.append(np.diff(t), np.median(np.diff(t))), 0, MAX_STEP_S)
            mid = part_middle(ds, p.episode, rows, g) if ref == "driver-or-middle" else None
            drivers = {"recorded": s, "centred 0.5 s": centred_average(full_t, full_s, 0.5)[rows],
                       "centred 1 s": centred_average(full_t, full_s, 1.0)[rows],
                       "trailing 0.5 s": trailing(full_t, full_s)[rows], "straight": np.zeros_like(s)}
            if ref == "driver": T += float(dt.sum())
            for k, d in drivers.items():
                tot[(ref, k)] = tot.get((ref, k), 0) + count_interventions(veh, d, s, v, dt, DEFAULT_MAX_OFFSET_M, DEFAULT_MAX_YAW_RAD, mid)
    print(path, "%.0f s held out" % T)
    for (ref, k), n in tot.items():
        print("   %-17s %-15s %3d  %.1f per 100 s" % (ref, k, n, 100 * n / T))
