import torch, time, statistics, sys
torch.set_num_threads(int(sys.argv[1]))
sdpa = torch.nn.functional.scaled_dot_product_attention
def bench(n, d, layout, which, reps=5):
    H=8
    g=torch.Generator().manual_seed(1)
    def make():
        if layout=="bhnd": t=torch.rand(1,H,n,d,generator=g)*2-1
        else: t=(torch.rand(1,n,H,d,generator=g)*2-1).transpose(1,2)
        return t.requires_grad_(which!="fwd")
    q,k,v=make(),make(),make()
    dout=make().detach()
    out = sdpa(q,k,v) if which=="bwd" else None
    def run():
        if which=="fwd":
            with torch.no_grad(): sdpa(q,k,v)
        else: torch.autograd.grad(out,(q,k,v),dout,retain_graph=True)
    run(); ts=[]
    for _ in range(reps):
        t0=time.perf_counter(); run(); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)*1e3
for n in (1024,4096):
  for d in (64,128):
    for which in ("fwd","bwd"):
      a=bench(n,d,"bhnd",which); b=bench(n,d,"bnhd",which); a2=bench(n,d,"bhnd",which)
      print(f"N={n} d={d} {which}: contiguous (B,H,N,d) {min(a,a2):8.2f} ms   (B,N,H,d) view {b:8.2f} ms   ratio {b/min(a,a2):.2f}", flush=True)
