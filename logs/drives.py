"""Training-part drive interventions per 100 s, per collection folder."""
import json, sys, numpy as np, glob
for d in sys.argv[1:]:
    n = t = 0
    for f in sorted(glob.glob(d + '/episodes/*.npz')):
        m = json.loads(str(np.load(f, allow_pickle=True)['meta']))
        n += m['interventions']; t += m['elapsed_s']
    print(f"{d}: {n} in {t:.0f} s = {100*n/t:.1f} per 100 s")
