import sys, glob, numpy as np
for d in sys.argv[1:]:
    tot=slow=rev=0; segs=[]
    for f in sorted(glob.glob(d+'/episodes/*.npz')):
        z=np.load(f); v=z['speed']*2.23694; b=z['brake']; n=len(v); tot+=n
        s = v < 1.0; slow+=s.sum()
        # reversing: brake held while the (unsigned) speed rises
        r = (b > 0.5) & (np.r_[0, np.diff(v)] > 0.05); rev+=r.sum()
        idx=np.flatnonzero(s|r)
        if len(idx): segs.append((f[-9:-4], idx[:3].tolist(), idx[-1], n))
    print(f"{d.split('rec_')[-1]:55s} {tot:6d} slow<1mph {slow:5d} rev {rev:5d}", segs[:4])
