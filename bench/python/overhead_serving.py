#!/usr/bin/env python3
"""Python overhead of the serving calls against the C library, on the CPU: decode against a KV
cache (flashattn.flash_attn_with_kvcache, flashattn.forward_kvcache; C: fa_forward_kvcache) and a
packed ragged batch (flashattn.flash_attn_varlen_func, forward_varlen/backward_varlen; C: fa_forward
and fa_backward with desc->varlen). Like overhead.py: the C baseline is fa-bench-call run as its
own process, interleaved in rounds with the Python side so that load drift hits both; per call the
median over the calls of a round, then the median over the rounds; differences and ratios are taken
within a round, then their median.

Problems (f32):
- kvcache: batch 1, one new token appended (k, v given) and attended by one query, 8 query heads,
  8 kv heads, d 128, a cache of 4096 tokens holding 4095; causal. Contiguous, and paged with
  page_size 256 (16 pages, the block table naming them in reverse order). cache_seqlens is an int32
  tensor/array (as FlashAttention-2 callers pass it); it is not advanced, so every call appends to
  the same slot and solves the same problem.
- varlen: 8 sequences of lengths 1024, 256, 768, 128, 640, 384, 512, 384 (4096 tokens), 8 heads,
  d 64, causal; forward, and forward + backward.

What each column times:
- C: fa-bench-call, its own process, buffers allocated once (the library's own time).
- torch: flash_attn_with_kvcache (outside no_grad: the inputs do not require grad) /
  flash_attn_varlen_func under no_grad (fwd), with torch.autograd.grad and a dout (fwd+bwd).
- NumPy: flashattn.forward_kvcache / forward_varlen (+ backward_varlen) on NumPy views of the same
  memory, outputs allocated by the binding.
- C in-process (kvcache): fa_forward_kvcache called through ctypes on the library the binding
  loaded, on the same tensors' memory, into preallocated out/lse, alternated call by call with the
  torch op (then with the NumPy call). "torch - C in-proc" is the median of the per-pair
  differences: robust to the drift between processes (two processes running the same C call differ
  by more than the 20 us target on this kind of machine), and it includes the ctypes call (~1 us).
- paired (varlen): the torch op against the C calls through the binding into preallocated outputs
  (a few us of binding on a 20 to 200 ms call), alternated call by call: the median per-pair ratio.
- torch outside the C extension (varlen fwd+bwd): the op's wall time less its calls into
  flashattn._native (timed from Python); page faults: minor faults per call (allocation cost).

The breakdown (kvcache, contiguous) times the pieces of flash_attn_with_kvcache's path one by one,
"in situ" (each right after a C kernel call on the 4096-token cache, which streams 32 MiB of keys and
values through the caches and evicts Python's and torch's code and data, as in the real call) and
"hot" (back to back), and whole variants paired with the C call on the 4096-token cache and on a
16-token cache (caches warm): the pieces of a fix. Nothing in flashattn is changed: the variants
patch module attributes for the duration of a measurement or call its pieces directly.

Threads: OMP_NUM_THREADS (default: every core), set before torch and the library start,
torch.set_num_threads the same, and inherited by the C process. On a shared 2-core VM run it when
nothing else runs: with 2 threads a preempted OpenMP thread turns a 1 ms call into 9 to 16 ms.

    OMP_NUM_THREADS=2 python bench/python/overhead_serving.py --fa-bench-call build/bench/python/fa-bench-call
"""

import argparse
import contextlib
import ctypes
import os
import resource
import statistics
import subprocess
import time
from typing import Optional, Tuple

THREADS = int(os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1)))

import numpy as np  # noqa: E402  (after OMP_NUM_THREADS)
import torch  # noqa: E402

import flashattn  # noqa: E402
import flashattn._torch as fa_torch  # noqa: E402

torch.set_num_threads(THREADS)

VARLEN_LENS = (1024, 256, 768, 128, 640, 384, 512, 384)
PERF = time.perf_counter


def us(seconds):
    return 1e6 * seconds


def med_us(values):
    return us(statistics.median(values))


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_c(fa_bench_call, mode_args, reps, fresh=False):
    command = [fa_bench_call, *map(str, mode_args), str(reps)] + (["fresh"] if fresh else [])
    line = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict((key, float(value)) for key, value in (item.split("=") for item in line.split()))


def time_calls(fn, reps, warmup=3, before=None):
    """Wall times (s) of reps calls of fn; before (untimed) runs ahead of each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = PERF()
        fn()
        times.append(PERF() - t0)
    return times


def time_paired(fn_a, fn_b, reps, warmup=3):
    """fn_a and fn_b alternately: their wall times (s), pair by pair."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    a, b = [], []
    for _ in range(reps):
        t0 = PERF()
        fn_a()
        t1 = PERF()
        fn_b()
        t2 = PERF()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return a, b


# ---- the C library through ctypes, in this process ---------------------------------------------
class FaTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("batch", ctypes.c_int64),
                ("seqlen", ctypes.c_int64), ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("stride_batch", ctypes.c_int64), ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64)]


class FaKVCache(ctypes.Structure):
    _fields_ = [("k", FaTensor), ("v", FaTensor), ("block_table", ctypes.c_void_p),
                ("max_pages_per_seq", ctypes.c_int64), ("cache_seqlens", ctypes.c_void_p)]


class FaDescHead(ctypes.Structure):  # fa_attention_desc's first fields
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int)]


def loaded_library():
    """The libflashattn.so the binding runs on (mapped into this process by flashattn._native)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libflashattn.so"):
                return ctypes.CDLL(path)
    raise RuntimeError("libflashattn.so is not mapped into this process")


def fa_tensor(t):
    assert t.dtype == torch.float32 and t.is_contiguous()
    return FaTensor(t.data_ptr(), 0, *t.shape, 0, 0, 0)


class CInProcess:
    """fa_forward_kvcache(ctx, desc, q, cache, k, v, out, lse) through ctypes on the problem's
    tensors, into preallocated out/lse: the C call, in this process, for ~1 us of ctypes."""

    def __init__(self, lib, problem):
        self.lib = lib
        lib.fa_last_error.restype = ctypes.c_char_p
        ctx = ctypes.c_void_p()
        if lib.fa_context_create(1, 0, ctypes.byref(ctx)) != 0:  # FA_BACKEND_CPU
            raise RuntimeError("fa_context_create failed")
        self.ctx = ctx
        self.desc_buffer = (ctypes.c_uint64 * 128)()  # room for a larger fa_attention_desc
        lib.fa_attention_desc_init(self.desc_buffer)
        head = FaDescHead.from_buffer(self.desc_buffer)
        assert 0 < head.struct_size <= ctypes.sizeof(self.desc_buffer)
        head.causal = 1
        p = problem
        self.out, self.lse = torch.empty_like(p.q), torch.empty(p.q.shape[0], p.q.shape[2], p.q.shape[1])
        self.tensors = [fa_tensor(t) for t in (p.q, p.k, p.v, self.out)]
        self.cache = FaKVCache(fa_tensor(p.k_cache), fa_tensor(p.v_cache),
                               p.block_table.data_ptr() if p.block_table is not None else None,
                               p.block_table.shape[1] if p.block_table is not None else 0, p.cache_seqlens.data_ptr())
        q, k, v, out = (ctypes.byref(t) for t in self.tensors)
        self.fn = lib.fa_forward_kvcache
        lse = ctypes.c_void_p(self.lse.data_ptr())
        self.args = (ctx, self.desc_buffer, q, ctypes.byref(self.cache), k, v, out, lse)
        # The same arguments with ctx NULL: the library returns at once; what ctypes itself costs.
        self.null_args = (None,) + self.args[1:]
        self()

    def __call__(self):
        if self.fn(*self.args) != 0:
            raise RuntimeError(self.lib.fa_last_error().decode())

    def null_call(self):
        self.fn(*self.null_args)


# ---- problems ---------------------------------------------------------------------------------
class KVProblem:
    def __init__(self, page_size, batch=1, heads_q=8, heads_kv=8, head_dim=128, capacity=4096, cache_len=4095):
        gen = torch.Generator().manual_seed(0)
        rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
        self.page_size, self.batch, self.heads_q, self.heads_kv = page_size, batch, heads_q, heads_kv
        self.head_dim, self.capacity, self.cache_len = head_dim, capacity, cache_len
        self.q = rand(batch, 1, heads_q, head_dim)
        self.k, self.v = rand(batch, 1, heads_kv, head_dim), rand(batch, 1, heads_kv, head_dim)
        if page_size:
            pages = batch * capacity // page_size
            self.k_cache, self.v_cache = (rand(pages, page_size, heads_kv, head_dim) for _ in range(2))
            # The pages in reverse order, as fa-bench-call's table.
            self.block_table = torch.arange(pages - 1, -1, -1, dtype=torch.int32).reshape(batch, -1).contiguous()
        else:
            self.k_cache, self.v_cache = (rand(batch, capacity, heads_kv, head_dim) for _ in range(2))
            self.block_table = None
        self.cache_seqlens = torch.full((batch,), cache_len, dtype=torch.int32)
        self.np = {name: getattr(self, name).numpy() for name in ("q", "k", "v", "k_cache", "v_cache", "cache_seqlens")}
        self.np["block_table"] = None if self.block_table is None else self.block_table.numpy()

    @property
    def label(self):
        return "paged %d" % self.page_size if self.page_size else "contiguous"

    def c_args(self):
        return ["kvcache", self.batch, self.heads_q, self.heads_kv, self.head_dim, self.capacity, self.cache_len,
                self.page_size, 1, 1]

    def torch_call(self):
        return flashattn.flash_attn_with_kvcache(self.q, self.k_cache, self.v_cache, k=self.k, v=self.v,
                                                 cache_seqlens=self.cache_seqlens, block_table=self.block_table,
                                                 causal=True)

    def numpy_call(self):
        n = self.np
        return flashattn.forward_kvcache(n["q"], n["k_cache"], n["v_cache"], n["cache_seqlens"], k=n["k"], v=n["v"],
                                         block_table=n["block_table"], causal=True)


def measure_kv(problem, c_call, args):
    c = run_c(args.fa_bench_call, problem.c_args(), args.kv_reps)
    t_torch, c_torch = time_paired(problem.torch_call, c_call, args.kv_reps)
    t_np, c_np = time_paired(problem.numpy_call, c_call, args.kv_reps)
    return {"c": c["fwd_us"], "c_min": c["fwd_min_us"], "torch": med_us(t_torch), "numpy": med_us(t_np),
            "c_inproc": med_us(c_torch + c_np),
            "torch_minus_c": med_us([a - b for a, b in zip(t_torch, c_torch)]),
            "numpy_minus_c": med_us([a - b for a, b in zip(t_np, c_np)])}


class VarlenProblem:
    def __init__(self, lens=VARLEN_LENS, heads=8, head_dim=64):
        gen = torch.Generator().manual_seed(0)
        total = sum(lens)
        self.lens, self.heads, self.head_dim, self.max_len = lens, heads, head_dim, max(lens)
        self.cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
        self.q, self.k, self.v, self.dout = (torch.randn(total, heads, head_dim, generator=gen) for _ in range(4))
        self.tq, self.tk, self.tv = (t.detach().clone().requires_grad_() for t in (self.q, self.k, self.v))
        self.n = {name: getattr(self, name).numpy() for name in ("q", "k", "v", "dout", "cu")}
        self.out, self.lse = flashattn.forward_varlen(self.n["q"], self.n["k"], self.n["v"], self.n["cu"], self.n["cu"],
                                                      self.max_len, self.max_len, causal=True)
        # The binding into preallocated outputs (overhead.py's "paired"): the C calls plus a few us.
        self.options = flashattn._options(True, None, (-1, -1), None, 0.0, 0, 0, None, (128, 128), 0.0, None, None,
                                          None, (self.n["cu"], self.n["cu"], self.max_len, self.max_len))
        self.pre = {name: np.empty_like(self.n["q"]) for name in ("out", "dq", "dk", "dv")}
        self.pre["lse"] = np.empty_like(self.lse)

    def c_args(self):
        return ["varlen", self.heads, self.head_dim, 1, ",".join(map(str, self.lens))]

    def torch_fwd(self):
        with torch.no_grad():
            return flashattn.flash_attn_varlen_func(self.q, self.k, self.v, self.cu, self.cu, self.max_len,
                                                    self.max_len, causal=True)

    def torch_both(self):
        out = flashattn.flash_attn_varlen_func(self.tq, self.tk, self.tv, self.cu, self.cu, self.max_len, self.max_len,
                                               causal=True)
        return torch.autograd.grad(out, (self.tq, self.tk, self.tv), self.dout)

    def numpy_fwd(self):
        n = self.n
        return flashattn.forward_varlen(n["q"], n["k"], n["v"], n["cu"], n["cu"], self.max_len, self.max_len,
                                        causal=True)

    def numpy_both(self):
        n = self.n
        out, lse = self.numpy_fwd()
        return flashattn.backward_varlen(n["q"], n["k"], n["v"], out, n["dout"], lse, n["cu"], n["cu"], self.max_len,
                                         self.max_len, causal=True)

    def binding_fwd(self):
        n, p = self.n, self.pre
        NATIVE.native.forward(n["q"], n["k"], n["v"], p["out"], p["lse"], True, *self.options, 0, None)

    def binding_both(self):
        n, p, native = self.n, self.pre, NATIVE.native
        self.binding_fwd()
        native.backward(n["q"], n["k"], n["v"], p["out"], n["dout"], p["lse"], p["dq"], p["dk"], p["dv"], None, None,
                        *self.options, 0, None)


class TimedNative:
    """Stands in for flashattn._torch._native while installed there: sums the time of its calls."""

    def __init__(self, native):
        self.native = native
        self.seconds = 0.0

    def __getattr__(self, name):
        fn = getattr(self.native, name)

        def timed(*args):
            t0 = PERF()
            try:
                return fn(*args)
            finally:
                self.seconds += PERF() - t0

        return timed


NATIVE = TimedNative(fa_torch._native)


def measure_varlen(problem, args):
    reps, fwd_reps = args.varlen_reps, 3 * args.varlen_reps
    c = run_c(args.fa_bench_call, problem.c_args(), reps)
    m = {"c_fwd": c["fwd_us"], "c_both": c["both_us"], "c_faults": c["faults"]}
    c = run_c(args.fa_bench_call, problem.c_args(), reps, fresh=True)
    m.update(c_fresh_fwd=c["fwd_us"], c_fresh_both=c["both_us"], c_fresh_faults=c["faults"])
    m["numpy_fwd"] = med_us(time_calls(problem.numpy_fwd, fwd_reps, warmup=1))
    problem.numpy_both()
    f0 = minor_faults()
    m["numpy_both"] = med_us(time_calls(problem.numpy_both, reps, warmup=0))
    m["numpy_faults"] = (minor_faults() - f0) / reps
    m["torch_fwd"] = med_us(time_calls(problem.torch_fwd, fwd_reps, warmup=1))
    fa_torch._native = NATIVE  # the kernel's share of torch fwd+bwd: the C extension's calls, timed
    try:
        walls, kernels = [], []
        problem.torch_both()
        f0 = minor_faults()
        for _ in range(reps):
            NATIVE.seconds = 0.0
            t0 = PERF()
            problem.torch_both()
            walls.append(PERF() - t0)
            kernels.append(NATIVE.seconds)
        m["torch_faults"] = (minor_faults() - f0) / reps
    finally:
        fa_torch._native = NATIVE.native
    m["torch_both"] = med_us(walls)
    m["torch_rest"] = med_us([w - k for w, k in zip(walls, kernels)])
    for key, torch_fn, binding_fn, n in (("fwd", problem.torch_fwd, problem.binding_fwd, fwd_reps),
                                         ("both", problem.torch_both, problem.binding_both, reps)):
        a, b = time_paired(torch_fn, binding_fn, n, warmup=1)
        m["paired_" + key] = statistics.median(x / y for x, y in zip(a, b))
    return m


# ---- where flash_attn_with_kvcache's time goes -----------------------------------------------
_OUT_STUB, _LSE_STUB = torch.empty(1, 1, 8, 128), torch.empty(1, 8, 1)


@torch.library.custom_op("serving_bench::forward_kvcache", mutates_args=("k_cache", "v_cache"))
def _bare_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                  v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor], cache_seqlens_int: int,
                  block_table: Optional[torch.Tensor], softmax_scale: float, causal: bool, window_left: int,
                  window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
                  want_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """flashattn::forward_kvcache's schema and mutation annotations, a body that does nothing:
    the cost of torch.library's custom-op dispatch."""
    return _OUT_STUB, _LSE_STUB


# The same op through torch.library.Library (define + a CPU kernel), without custom_op's Python
# layers (autograd, ADInplaceOrView and backend wrappers, the dynamo-disable decorator): a fix to try.
_LIB = torch.library.Library("serving_bench", "FRAGMENT")
_LIB.define("forward_kvcache_lowlevel(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
            "Tensor? cache_seqlens, int cache_seqlens_int, Tensor? block_table, float softmax_scale, bool causal, "
            "int window_left, int window_right, float softcap, Tensor? alibi_slopes, bool want_lse) -> (Tensor, Tensor)")
_LIB.impl("forward_kvcache_lowlevel", fa_torch._forward_kvcache._init_fn, "CPU")


_KVCACHE_BODY = fa_torch._forward_kvcache._init_fn


class patched:
    """with patched(module, name, value): module.name = value inside."""

    def __init__(self, module, name, value):
        self.module, self.name, self.value = module, name, value

    def __enter__(self):
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)


def breakdown(problem, c_call, small, small_c_call, n):
    """Pieces of flash_attn_with_kvcache's path, each timed right after a C kernel call on the
    problem (in situ: the caches as the kernel leaves them) and back to back (hot); then whole
    alternatives, paired with the C call, on the problem and on a small cache (16 tokens: caches
    warm). Overheads include the ctypes call (added back)."""
    p = problem
    scale = p.head_dim ** -0.5
    insitu = lambda fn: med_us(time_calls(fn, n, before=c_call))  # noqa: E731
    hot = lambda fn: med_us(time_calls(fn, 4 * n))  # noqa: E731
    rows = []

    def piece(name, fn):
        rows.append((name, insitu(fn), hot(fn)))

    def op_args(x):
        return (x.q, x.k_cache, x.v_cache, x.k, x.v, x.cache_seqlens, 0, x.block_table, scale, True, -1, -1, 0.0, None,
                False)

    with patched(fa_torch, "_forward_kvcache_body", lambda *a: (None, None)):
        piece("flash_attn_with_kvcache's own Python (checks, _readable x3, _scale_for, ...)", p.torch_call)
    piece("custom-op dispatch (the op's schema, a body that returns two tensors)", lambda: _bare_kvcache(*op_args(p)))
    piece("torch.empty for out and lse", lambda: (torch.empty(p.q.shape, dtype=p.q.dtype, device=p.q.device),
                                                 torch.empty((1, 8, 1), dtype=torch.float32, device=p.q.device)))
    tensors = (p.q, p.k_cache, p.v_cache, p.k, p.v, _OUT_STUB, _LSE_STUB, p.cache_seqlens)
    piece("to_dlpack x8 (q, caches, k, v, out, lse, cache_seqlens)",
          lambda: [torch.utils.dlpack.to_dlpack(t) for t in tensors])
    piece("_torch._options + torch_stream",
          lambda: (fa_torch._options(0.0, scale, True, -1, -1, 0, 0, 0.0, None, None, None),
                   fa_torch.torch_stream(p.q)))
    # The binding on capsules made ahead (untimed), into preallocated out/lse, paired with the C call.
    options = fa_torch._options(0.0, scale, True, -1, -1, 0, 0, 0.0, None, None, None)
    ctypes_cost = hot(c_call.null_call)

    def binding_overhead(x, x_c_call):
        walls_b, walls_c = [], []
        for i in range(n + 3):
            q, kc, vc, k, v, out, lse, sl = [torch.utils.dlpack.to_dlpack(t) for t in
                                             (x.q, x.k_cache, x.v_cache, x.k, x.v, x_c_call.out, x_c_call.lse,
                                              x.cache_seqlens)]
            t0 = PERF()
            fa_torch._native.forward_kvcache(q, kc, vc, k, v, out, lse, True, sl, None, *options, 0, None)
            t1 = PERF()
            x_c_call()
            t2 = PERF()
            if i >= 3:
                walls_b.append(t1 - t0)
                walls_c.append(t2 - t1)
        return med_us([b - c for b, c in zip(walls_b, walls_c)]) + ctypes_cost

    rows.append(("binding: _native.forward_kvcache on capsules made ahead, into preallocated out/lse, - C (paired; "
                 "hot: on the 16-token cache)", binding_overhead(p, c_call), binding_overhead(small, small_c_call)))

    def overhead(x, x_c_call, fn, context):
        with context():
            a, b = time_paired(fn, x_c_call, n)
        return med_us([s - t for s, t in zip(a, b)]) + ctypes_cost

    def body_preallocated(x, out, lse):
        def call():
            fa_torch._native.forward_kvcache(*(torch.utils.dlpack.to_dlpack(t) for t in (x.q, x.k_cache, x.v_cache, x.k,
                                                                                         x.v, out, lse)),
                                             True, torch.utils.dlpack.to_dlpack(x.cache_seqlens), None, *options, 0,
                                             None)
        return call

    plain = contextlib.nullcontext
    variants = [  # (name, the call for a problem, the context the measurement runs in)
        ("flash_attn_with_kvcache as is", lambda x: x.torch_call, plain),
        ("... under torch.inference_mode()", lambda x: x.torch_call, torch.inference_mode),
        ("... with cache_seqlens=4095, a Python int (the binding copies it into a table)",
         lambda x: lambda: flashattn.flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, k=x.k, v=x.v,
                                                            cache_seqlens=x.cache_len, causal=True), plain),
        ("... through the custom op's dispatch (what plain eager calls skip)",
         lambda x: x.torch_call, lambda: patched(fa_torch, "_runs_eagerly", lambda *t: False)),
        ("the op's body called directly (torch.empty x2, to_dlpack x8, binding)",
         lambda x: lambda: _KVCACHE_BODY(*op_args(x)), plain),
        ("the body with tensors passed to the binding (their __dlpack__) instead of to_dlpack",
         lambda x: lambda: _body_via_dunder_dlpack(*op_args(x)), plain),
        ("the body into preallocated out/lse (to_dlpack x8, binding)",
         lambda x: body_preallocated(x, torch.empty_like(x.q), torch.empty(1, x.heads_q, 1)), plain),
        ("the body as a torch.library.Library op (define + CPU kernel; eager only here, no fake kernel)",
         lambda x: lambda: torch.ops.serving_bench.forward_kvcache_lowlevel(*op_args(x)), plain),
        ("flashattn.forward_kvcache (NumPy)", lambda x: x.numpy_call, plain),
    ]
    alternatives = []
    for name, make, context in variants:
        alternatives.append((name, overhead(p, c_call, make(p), context),
                             overhead(small, small_c_call, make(small), context)))
    return rows, ctypes_cost, alternatives


def _body_via_dunder_dlpack(q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlens_int, block_table, softmax_scale,
                            causal, window_left, window_right, softcap, alibi_slopes, want_lse):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    fa_torch._native.forward_kvcache(q, k_cache, v_cache, k, v, out, lse, True, cache_seqlens, block_table,
                                     *fa_torch._options(0.0, softmax_scale, causal, window_left, window_right, 0, 0,
                                                        softcap, None, alibi_slopes, None), 0, None)
    return out, lse


# ---- report -------------------------------------------------------------------------------------
def median_of(rounds, key):
    return statistics.median(r[key] for r in rounds)


def cpu_model():
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return "%s (family %s, model %s, stepping %s), %s CPUs" % (
        fields.get("Model name", "?"), fields.get("CPU family", "?"), fields.get("Model", "?"),
        fields.get("Stepping", "?"), fields.get("CPU(s)", "?"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fa-bench-call", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kv-reps", type=int, default=150, help="calls per round and variant (kvcache)")
    parser.add_argument("--varlen-reps", type=int, default=3,
                        help="fwd+bwd calls per round and variant (varlen); forward only: 3 times as many")
    parser.add_argument("--breakdown-reps", type=int, default=300)
    parser.add_argument("--skip", choices=["kvcache", "varlen", "breakdown"], action="append", default=[])
    args = parser.parse_args()
    lib = loaded_library()
    kv_problems = [KVProblem(0), KVProblem(256)] if "kvcache" not in args.skip else []
    c_calls = [CInProcess(lib, p) for p in kv_problems]
    varlen = VarlenProblem() if "varlen" not in args.skip else None
    kv_rounds = [[] for _ in kv_problems]
    varlen_rounds = []
    load = [os.getloadavg()[0]]
    t_start = PERF()
    for _ in range(args.rounds):
        for problem, c_call, rounds in zip(kv_problems, c_calls, kv_rounds):
            rounds.append(measure_kv(problem, c_call, args))
        if varlen is not None:
            varlen_rounds.append(measure_varlen(varlen, args))
        load.append(os.getloadavg()[0])
    print("flashattn %s (%s), torch %s, NumPy %s; OMP_NUM_THREADS=%d, torch threads %d" % (
        flashattn.__version__, flashattn.backends()["cpu"].detail, torch.__version__, np.__version__, THREADS,
        torch.get_num_threads()))
    print("%s; load average (1 min) %s during the rounds; %d rounds in %.0f s" % (
        cpu_model(), " ".join("%.1f" % x for x in load), args.rounds, PERF() - t_start))
    print("per call: median of the calls of a round, then median over the rounds, us")
    if kv_problems:
        print("\nflash_attn_with_kvcache: batch 1, 1 new token (k, v appended), 8 q / 8 kv heads, d 128, cache 4096 "
              "holding 4095, causal, f32; %d calls per round and variant; target: torch - C <= 20 us" % args.kv_reps)
        print("\n| cache | C | C in-process | torch op | NumPy | torch - C | NumPy - C | torch - C in-proc, paired "
              "| NumPy - C in-proc, paired |")
        print("|---|---|---|---|---|---|---|---|---|")
        for problem, r in zip(kv_problems, kv_rounds):
            print("| %s | %.1f | %.1f | %.1f | %.1f | %+.1f | %+.1f | %+.1f | %+.1f |" % (
                problem.label, median_of(r, "c"), median_of(r, "c_inproc"), median_of(r, "torch"),
                median_of(r, "numpy"), statistics.median(x["torch"] - x["c"] for x in r),
                statistics.median(x["numpy"] - x["c"] for x in r), median_of(r, "torch_minus_c"),
                median_of(r, "numpy_minus_c")))
        print("\nper round, torch - C in-proc, paired: %s" % "; ".join(
            "%s: %s" % (p.label, " ".join("%.1f" % x["torch_minus_c"] for x in r))
            for p, r in zip(kv_problems, kv_rounds)))
    if varlen is not None:
        r = varlen_rounds
        print("\nflash_attn_varlen_func: 8 sequences (%s = %d tokens), 8 heads, d 64, causal, f32; %d calls per round "
              "and variant; target: torch / C <= 1.05" % (",".join(map(str, VARLEN_LENS)), sum(VARLEN_LENS),
                                                           args.varlen_reps))
        print("\n| pass | C | C fresh | NumPy | torch op | NumPy / C | torch / C | torch / binding, paired |")
        print("|---|---|---|---|---|---|---|---|")
        for name, key in (("fwd", "fwd"), ("fwd+bwd", "both")):
            print("| %s | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f |" % (
                name, median_of(r, "c_" + key), median_of(r, "c_fresh_" + key), median_of(r, "numpy_" + key),
                median_of(r, "torch_" + key), statistics.median(x["numpy_" + key] / x["c_" + key] for x in r),
                statistics.median(x["torch_" + key] / x["c_" + key] for x in r), median_of(r, "paired_" + key)))
        print("\nC fresh: the C process allocating its outputs per call (malloc/free), as the torch op does. fwd+bwd: "
              "torch outside the C extension's calls %.0f us; minor page faults per call: C %.0f, C fresh %.0f, "
              "NumPy %.0f, torch %.0f; per round, torch / C: fwd %s, fwd+bwd %s" % (
                  median_of(r, "torch_rest"), median_of(r, "c_faults"), median_of(r, "c_fresh_faults"),
                  median_of(r, "numpy_faults"), median_of(r, "torch_faults"),
                  " ".join("%.3f" % (x["torch_fwd"] / x["c_fwd"]) for x in r),
                  " ".join("%.3f" % (x["torch_both"] / x["c_both"]) for x in r)))
    if kv_problems and "breakdown" not in args.skip:
        small = KVProblem(0, capacity=16, cache_len=15)
        rows, ctypes_cost, alternatives = breakdown(kv_problems[0], c_calls[0], small, CInProcess(lib, small),
                                                    args.breakdown_reps)
        print("\nwhere flash_attn_with_kvcache's overhead goes (contiguous cache), us per call; in situ: each call "
              "right after a C kernel call on the 4096-token cache; hot: back to back")
        print("\n| piece | in situ | hot |")
        print("|---|---|---|")
        for name, insitu, hot in rows:
            print("| %s | %.1f | %s |" % (name, insitu, "%.1f" % hot if hot is not None else ""))
        print("| sum of the pieces | %.1f | %.1f |" % (sum(r[1] for r in rows), sum(r[2] for r in rows)))
        print("| whole: torch op - C, paired (below; hot: on the 16-token cache) | %.1f | %.1f |" % alternatives[0][1:])
        print("\n| variant: overhead over the C call, paired call by call (the ctypes call, %.1f us, added back) "
              "| cache 4096 (in situ) | cache 16 (warm) |" % ctypes_cost)
        print("|---|---|---|")
        for name, big, small_value in alternatives:
            print("| %s | %+.1f | %+.1f |" % (name, big, small_value))


if __name__ == "__main__":
    main()
