import sys, glob, numpy as np
for d in sys.argv[1:]:
    for f in sorted(glob.glob(d+'/episodes/*.npz')):
        z=np.load(f); v=z['speed']*2.23694; b=z['brake']; st=z['action'][:,0]
        r = (b > 0.5) & (np.r_[0, np.diff(v)] > 0.05); s = v < 1.0
        m = s|r; idx=np.flatnonzero(m)
        if not len(idx): continue
        # group into runs with gaps <= 10 frames
        groups=[]; a=idx[0]; p=idx[0]
        for i in idx[1:]:
            if i-p>10: groups.append((a,p)); a=i
            p=i
        groups.append((a,p))
        print(d.split('rec_')[-1][:30], f[-9:-4], len(v), [(int(a),int(b_), int(r[a:b_+1].sum()), round(float(v[max(a-20,0):a+1].min()),1)) for a,b_ in groups])
