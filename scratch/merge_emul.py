# Emulates the serial searchMerge (a7ad91a) and the warp version (branch s30-exact-pending) over random inputs; compares states.
import random, copy
M64=(1<<64)-1
def serial(st, rb, tp, h, nb, shift, zb, tie_d, tie_m, massTerm, keyOfPrefix, ceilMass):
    st=copy.deepcopy(st)
    def bin_(r,d):
        v=rb[r][d]
        if d==tie_d: v+=st['quota'][r]*tie_m
        return v
    total=sum(h[:nb])
    done=False
    if st['mode']=='K':
        if st['round']==0 and total<st['need']: done=True
        else:
            above=0; d=nb-1
            while d>0 and above+h[d]<st['need']:
                above+=h[d]; d-=1
            st['need']-=above
            st['prefix']|=d<<shift
            if h[d]==st['need'] or shift<=zb:
                st['has_thr']=1; st['qall']=int(h[d]==st['need'])
                st['tkey']=st['prefix'] if st['qall'] else keyOfPrefix(st['prefix'],shift)
                if not st['qall']:
                    left=st['need']
                    for r in range(8):
                        c=rb[r][d] if r<tp else 0
                        st['quota'][r]=min(left,c); left-=st['quota'][r]
                done=True
        if done:
            st['mode']='P' if st['topp_after'] else 'R'; st['round']=0; st['prefix']=0; st['above']=0
            return st
        st['round']+=1; return st
    if st['round']==0:
        st['P']=ceilMass(st['top_p']*total); st['above']=0
    above=st['above']; d=nb-1
    while d>0 and above+h[d]<st['P']:
        above+=h[d]; d-=1
    st['above']=above
    st['prefix']|=d<<shift
    if above+h[d]<=st['P'] or shift<=zb:
        q=[0]*8
        allk=above+h[d]<=st['P']
        kone=keyOfPrefix(st['prefix'],shift)
        if not allk:
            m=massTerm(kone)
            if m==0: allk=True
            else:
                left=(st['P']-above+m-1)//m
                for r in range(8):
                    c=bin_(r,d)//m if r<tp else 0
                    q[r]=min(left,c); left-=q[r]
        if not (allk and st['has_thr'] and st['prefix']<=st['tkey']):
            st['has_thr']=1; st['tkey']=st['prefix'] if allk else kone; st['qall']=int(allk)
            if not allk: st['quota']=q[:]
        st['mode']='R'; st['round']=0; return st
    st['round']+=1; return st

def warp(st, rb, tp, h, nb, shift, zb, tie_d, tie_m, massTerm, keyOfPrefix, ceilMass):
    old=st; st=copy.deepcopy(st)
    L=range(32)
    h0=[h[2*l] if 2*l<nb else 0 for l in L]; h1=[h[2*l+1] if 2*l+1<nb else 0 for l in L]
    S0=[h0[l]+h1[l] for l in L]
    o=1
    while o<32:
        y=[S0[l+o] if l+o<32 else S0[l] for l in L]   # shfl_down returns own value when out of range
        S0=[S0[l]+y[l] if l+o<32 else S0[l] for l in L]; o<<=1
    S1=[S0[l]-h0[l] for l in L]; total=S0[0]
    def reach(base,goal):
        b1=[l for l in L if 2*l+1<nb and base+S1[l]>=goal]
        b0=[l for l in L if 2*l>=1 and 2*l<nb and base+S0[l]>=goal]
        d=2*max(b1)+1 if b1 else 0
        if b0 and 2*max(b0)>d: d=2*max(b0)
        src=d>>1
        sd=S1[src] if d&1 else S0[src]; hd=h1[src] if d&1 else h0[src]
        return d,hd,sd-hd
    def quotaOf(left,c):  # c: list per lane
        inc=c[:]; o=1
        while o<32:
            y=[inc[l-o] if l>=o else inc[l] for l in L]
            inc=[inc[l]+y[l] if l>=o else inc[l] for l in L]; o<<=1
        before=[inc[l]-c[l] for l in L]
        return [min(left-before[l] if left>before[l] else 0, c[l]) for l in L]
    if old['mode']=='K':
        need=old['need']; prefix=old['prefix']; done=thr=qall=False; tkey=0; q=[0]*32
        if old['round']==0 and total<need: done=True
        else:
            d,hd,above=reach(0,need)
            need-=above; prefix|=d<<shift
            if hd==need or shift<=zb:
                thr=True; qall=hd==need; tkey=prefix if qall else keyOfPrefix(prefix,shift)
                q=quotaOf(need,[rb[r][d] if r<8 and r<tp else 0 for r in L]); done=True
        if thr and not qall:
            for r in range(8): st['quota'][r]=q[r]
        if thr: st['has_thr']=1; st['qall']=int(qall); st['tkey']=tkey
        if done: st['mode']='P' if old['topp_after'] else 'R'; st['round']=0; st['prefix']=0; st['above']=0; st['need']=need
        else: st['need']=need; st['prefix']=prefix; st['round']=old['round']+1
        return st
    P=ceilMass(old['top_p']*total) if old['round']==0 else old['P']
    above=0 if old['round']==0 else old['above']
    d,hd,rel=reach(above,P); above+=rel
    prefix=old['prefix']|(d<<shift)
    last=above+hd<=P or shift<=zb
    allk=above+hd<=P; sett=False; q=[0]*32; tkey=0
    if last:
        kone=keyOfPrefix(prefix,shift)
        if not allk:
            m=massTerm(kone)
            if m==0: allk=True
            else:
                c=[((rb[r][d]+(old['quota'][r]*tie_m if d==tie_d else 0))//m) if r<8 and r<tp else 0 for r in L]
                q=quotaOf((P-above+m-1)//m,c)
        sett=not (allk and old['has_thr'] and prefix<=old['tkey'])
        tkey=prefix if allk else kone
    if sett and not allk:
        for r in range(8): st['quota'][r]=q[r]
    st['P']=P; st['above']=above; st['prefix']=prefix
    if last:
        if sett: st['has_thr']=1; st['tkey']=tkey; st['qall']=int(allk)
        st['mode']='R'; st['round']=0
    else: st['round']=old['round']+1
    return st

random.seed(1)
bad=0; N=20000
for it in range(N):
    nb=random.choice([64,64,64,16,4]); tp=random.randint(1,8); shift=random.choice([26,20,14,8,2,0]); zb=random.choice([16,13,0])
    mode=random.choice('KP')
    sparse=random.random()<0.5
    rb=[[ (random.randint(0,50) if random.random()<0.3 else 0) if sparse else random.randint(0,1<<random.randint(0,40)) for d in range(64)] for r in range(8)]
    if mode=='K': rb=[[x % 1000 for x in row] for row in rb]
    quota=[random.randint(0,5) for _ in range(8)]
    tie_d=random.choice([-1,random.randrange(nb)]) if mode=='P' else -1
    tie_m=random.randint(1,1<<30)
    h=[sum(rb[r][d]+(quota[r]*tie_m if d==tie_d else 0) for r in range(tp)) for d in range(64)]
    tot=sum(h[:nb])
    st=dict(mode=mode,round=random.choice([0,0,1,2]),need=random.randint(1,max(1,tot+5)),prefix=random.randrange(1<<32)&~((1<<(shift+6))-1) if shift<26 else 0,
            above=random.randint(0,10**6),P=random.randint(1,max(1,tot)),top_p=random.random(),has_thr=random.randint(0,1),qall=0,tkey=random.randrange(1<<32),
            quota=quota[:],topp_after=random.randint(0,1))
    if st['round']>0: st['above']=random.randint(0,st['P']-1)
    mt_c=random.choice([0,1,7,1<<20])
    massTerm=lambda k: mt_c
    keyOfPrefix=lambda p,s: p if p&0x80000000 else p|((1<<s)-1)
    import math
    ceilMass=lambda p: 1 if not p>=1 else math.ceil(p)
    a=serial(st,rb,tp,h,nb,shift,zb,tie_d,tie_m,massTerm,keyOfPrefix,ceilMass)
    b=warp(st,rb,tp,h,nb,shift,zb,tie_d,tie_m,massTerm,keyOfPrefix,ceilMass)
    if a!=b:
        bad+=1
        if bad<4: print('DIFF',mode,{k:(a[k],b[k]) for k in a if a[k]!=b[k]})
print('cases',N,'differ',bad)
