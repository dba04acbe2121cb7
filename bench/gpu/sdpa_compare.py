#!/usr/bin/env python3
"""flashattn's CUDA backend against PyTorch's scaled_dot_product_attention (flash backend) on the
same GPU, same tensors: fp16 and bf16, d = 64 and 128, N = 1k..16k with batch * N = 16k, 16 heads,
dense and causal. Prints forward and forward+backward TFLOP/s and the ratios the CUDA issue
targets (forward >= 0.9x, forward+backward >= 0.85x).
FLOPs: bench/flops.py (4 N^2 d heads batch forward, 3.5x that forward+backward; causal counts the
N(N+1)/2 visible scores).

flashattn is called through ctypes on the tensors' device pointers, on PyTorch's current stream.
Usage: python3 sdpa_compare.py [--lib build/src/libflashattn.so] [--quick]
Status: ran on an NVIDIA H200 (bench/results/gpu-h200-2026-11-24-s11.md).
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from flops import attention_flops  # noqa: E402  (bench/flops.py: the benchmarks' one FLOP convention)

FA_DTYPE = {torch.float16: 1, torch.bfloat16: 2}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("batch", ctypes.c_int64),
                ("seqlen", ctypes.c_int64), ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("stride_batch", ctypes.c_int64), ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64)]


class Desc(ctypes.Structure):
    # The 0.1 members after struct_size: the smallest layout the library accepts (README, "ABI").
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("seqlens_k", ctypes.c_void_p), ("dropout_p", ctypes.c_float),
                ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64), ("block_mask", ctypes.c_void_p)]


class FlashAttn:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.fa_last_error.restype = ctypes.c_char_p
        self.lib.fa_context_info.restype = ctypes.c_char_p
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.fa_context_create(2, 0, ctypes.byref(self.ctx)), "fa_context_create(CUDA)")
        stream = torch.cuda.current_stream().cuda_stream
        self.check(self.lib.fa_context_set_stream(self.ctx, ctypes.c_void_p(stream)), "fa_context_set_stream")

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: {self.lib.fa_last_error().decode()}")

    def info(self):
        return self.lib.fa_context_info(self.ctx).decode()

    @staticmethod
    def tensor(t):
        # t is [batch, heads, seqlen, d] (PyTorch's SDPA layout); describe it with strides.
        b, h, n, d = t.shape
        sb, sh, ss, _ = t.stride()
        return Tensor(t.data_ptr(), FA_DTYPE[t.dtype], b, n, h, d, sb, ss, sh)

    def forward(self, desc, q, k, v, out, lse):
        self.check(self.lib.fa_forward(self.ctx, ctypes.byref(desc), ctypes.byref(self.tensor(q)),
                                       ctypes.byref(self.tensor(k)), ctypes.byref(self.tensor(v)),
                                       ctypes.byref(self.tensor(out)), ctypes.c_void_p(lse.data_ptr())), "fa_forward")

    def backward(self, desc, q, k, v, out, dout, lse, dq, dk, dv):
        t = self.tensor
        self.check(self.lib.fa_backward(self.ctx, ctypes.byref(desc), ctypes.byref(t(q)), ctypes.byref(t(k)),
                                        ctypes.byref(t(v)), ctypes.byref(t(out)), ctypes.byref(t(dout)),
                                        ctypes.c_void_p(lse.data_ptr()), ctypes.byref(t(dq)), ctypes.byref(t(dk)),
                                        ctypes.byref(t(dv))), "fa_backward")


def time_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--lib", default=os.path.join(here, "..", "..", "build", "src", "libflashattn.so"))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="N = 1k and 4k only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: nothing to compare")
    fa = FlashAttn(args.lib)
    print(f"# {fa.info()}")
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")
    heads = 16
    seqlens = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384]
    print(f"{'dtype':6} {'d':>4} {'N':>6} {'causal':>6} | {'sdpa fwd':>9} {'fa fwd':>9} {'ratio':>6} | "
          f"{'sdpa f+b':>9} {'fa f+b':>9} {'ratio':>6}   (TFLOP/s)")
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for n in seqlens:
                for causal in (False, True):
                    batch = max(1, 16384 // n)
                    shape = (batch, heads, n, d)
                    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
                    flops = attention_flops(batch * heads, n, n, d, causal, "fwd")
                    flops_fb = attention_flops(batch * heads, n, n, d, causal, "fwdbwd")
                    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

                    def sdpa_fwd():
                        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                    def sdpa_fb():
                        out = sdpa_fwd()
                        out.backward(dout)

                    desc = Desc(ctypes.sizeof(Desc), 0.0, int(causal), -1, -1, None, 0.0, 0, 0, None)
                    out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
                    lse = torch.empty((batch, heads, n), device="cuda", dtype=torch.float32)

                    def fa_fwd():
                        fa.forward(desc, q, k, v, out, lse)

                    def fa_fb():
                        fa.forward(desc, q, k, v, out, lse)
                        fa.backward(desc, q, k, v, out, dout, lse, dq, dk, dv)

                    with torch.no_grad():
                        t_sdpa_fwd = time_ms(sdpa_fwd, args.iters)
                    t_fa_fwd = time_ms(fa_fwd, args.iters)
                    t_sdpa_fb = time_ms(sdpa_fb, args.iters)
                    t_fa_fb = time_ms(fa_fb, args.iters)
                    # Same result as SDPA, so the timing compares like with like.
                    with torch.no_grad():
                        err = (out.float() - sdpa_fwd().float()).abs().max().item()
                    tf = lambda f, ms: f / ms / 1e9
                    print(f"{str(dtype)[6:]:6} {d:4} {n:6} {str(causal):>6} | {tf(flops, t_sdpa_fwd):9.1f} "
                          f"{tf(flops, t_fa_fwd):9.1f} {t_sdpa_fwd / t_fa_fwd:6.2f} | {tf(flops_fb, t_sdpa_fb):9.1f} "
                          f"{tf(flops_fb, t_fa_fb):9.1f} {t_sdpa_fb / t_fa_fb:6.2f}   max|O-O_sdpa|={err:.2e}")


if __name__ == "__main__":
    main()
