# One forward and one backward of flashattn (tc family by env) at a given shape, for ncu.
import ctypes, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "gpu"))
from sdpa_compare import FlashAttn, Desc
d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
causal = len(sys.argv) > 3 and sys.argv[3] == "causal"
fa = FlashAttn(os.path.join(os.path.dirname(__file__), "bin", "libflashattn.so"))
print(fa.info())
b, h = max(1, 16384 // n), 16
q, k, v, dout = (torch.randn((b, h, n, d), device="cuda", dtype=torch.float16) for _ in range(4))
out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
lse = torch.empty((b, h, n), device="cuda", dtype=torch.float32)
desc = Desc(ctypes.sizeof(Desc), 0.0, int(causal), -1, -1, None, 0.0, 0, 0, None)
for _ in range(2):
    fa.forward(desc, q, k, v, out, lse)
    fa.backward(desc, q, k, v, out, dout, lse, dq, dk, dv)
torch.cuda.synchronize()
print("ok", out.float().abs().mean().item())
