#!/usr/bin/env python3
"""flashattn's CUDA backend against PyTorch's scaled_dot_product_attention (flash backend) on the
same GPU, same tensors, and one build of the plugin against another in the same run.

Grid (default): f16 and bf16, d = 64 and 128, N = 1k..16k with batch * N = 16k, 16 heads, dense
and causal; --quick: N = 1k and 4k. Three columns per implementation: forward, forward+backward,
backward alone (from a stored forward). TFLOP/s by bench/flops.py (4 N^2 d per head forward, 2.5x
that backward, 3.5x both; causal counts the N(N+1)/2 visible scores).

Plugins. --plugin-dir NAME=DIR (repeatable) names a folder with a plugin (libflashattn-cuda.so),
best with its own core library beside it (libflashattn.so, as scripts/gpu-stage.sh stages them);
a folder without one gets a private copy of --lib's. The first is the base that the others are
compared with. --kernels NAME=FAMILY sets FLASHATTN_GPU_KERNELS for one of them ("default": the
vendor's default family; without --kernels, the variable as set outside). Without --plugin-dir,
--lib alone is timed (named "fa").
All plugins live in this one process: the core library loads its plugin at the first context and
keeps it, so each plugin folder gets its own core (ctypes loads a path, and two files are two
libraries), with FLASHATTN_PLUGIN_DIR and FLASHATTN_GPU_KERNELS set around each context's creation;
two names for one folder (two kernel families of one build) share its core, a context each.
One process means the same input tensors, the same stream and no copies between processes, and
the samples of a round come right after one another: per round and column, one SDPA sample, then
the plugins in the order base, new, new, base (with more plugins: a, b, c, c, b, a), so that a
drift in clock or temperature weighs on both sides alike. A sample is one call between two CUDA
events, queued behind a short GPU sleep so that the host's launch time stays out of it.
Ratios are medians over the rounds of the per-round ratio (SDPA time / plugin time: > 1 is faster
than SDPA; base time / plugin time: > 1 is faster than the base); TFLOP/s are from median times.

Correctness. Before every call (checks and timed samples alike) the plugin's outputs (O, lse, dQ,
dK, dV) are filled with NaN, and after every call they must be finite everywhere, so a kernel that
writes nothing or part of its output fails. Once per cell, O, lse, dQ, dK and dV of batch 0's first
--check-heads heads are compared with SDPA's autograd on the inputs upcast to fp32 (math backend,
no TF32) by ||x - ref|| / ||ref|| (lse: max |x - ref|). A plugin passes if its error is at most
twice SDPA flash's own (the same measure, same reference) or under a floor (f16 1e-3, bf16 8e-3
for O; 4x that for the gradients; 1e-3 absolute for lse). A failed cell is reported and the run
goes on; the exit status is 1 if any check failed or a plugin could not run.

Usage:
  python3 sdpa_compare.py [--lib build/src/libflashattn.so] [--quick] [--iters 30] [--csv FILE]
  python3 sdpa_compare.py --plugin-dir base=gpu-stage/base --plugin-dir new=gpu-stage/new \\
      --kernels new=tc-wide --quick --csv sdpa.csv --markdown sdpa.md
  python3 sdpa_compare.py --profile new ...   a warm-up, then one forward+backward of that plugin
      between cudaProfilerStart/Stop (for ncu --profile-from-start off), first cell of the grid
  python3 sdpa_compare.py --self-test         checks the pure-Python parts; no torch, no GPU; with
      --plugin-dir, also creates each plugin's context and prints its info (no torch: the SIMT
      emulator's plugin, tests/gpu/emu, does it on a machine without a GPU)
  python3 sdpa_compare.py --dry-run           prints the plan (cells, order, sizes); no GPU
Status: the single-plugin form ran on an NVIDIA H200 (bench/results/gpu-h200-2026-11-24-s11.md);
the two-plugin form, the checks and the backward column have not run on a GPU yet.
"""
import argparse
import csv
import ctypes
import math
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from flops import attention_flops  # noqa: E402  (bench/flops.py: the benchmarks' one FLOP convention)

torch = None  # imported in main(), so --self-test and --dry-run run without it
F = None

MODES = ("fwd", "fwdbwd", "bwd")
MODE_TITLE = {"fwd": "forward", "fwdbwd": "forward+backward", "bwd": "backward only"}
DTYPES = ("f16", "bf16")
FA_DTYPE = {"f16": 1, "bf16": 2}
# Error floors (relative Frobenius norm) under which a result passes whatever SDPA's error is.
OUT_FLOOR = {"f16": 1e-3, "bf16": 8e-3}
GRAD_FLOOR_FACTOR = 4.0
LSE_TOL = 1e-3
SLEEP_CYCLES = 1_000_000  # about 0.5 ms at 2 GHz: longer than the host needs to queue one call


CSV_FIELDS = ["dtype", "d", "n", "causal", "batch", "heads", "mode", "impl", "kernels", "median_ms", "tflops",
              "vs_sdpa", "vs_base", "rounds", "err_out", "err_lse", "err_dq", "err_dk", "err_dv", "check"]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("batch", ctypes.c_int64),
                ("seqlen", ctypes.c_int64), ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("stride_batch", ctypes.c_int64), ("stride_seq", ctypes.c_int64), ("stride_head", ctypes.c_int64)]


class Desc(ctypes.Structure):
    # The 0.1 members after struct_size: the smallest layout the library accepts (README, "ABI").
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("seqlens_k", ctypes.c_void_p), ("dropout_p", ctypes.c_float),
                ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64), ("block_mask", ctypes.c_void_p)]


def make_desc(causal):
    return Desc(ctypes.sizeof(Desc), 0.0, int(causal), -1, -1, None, 0.0, 0, 0, None)


class FlashAttn:
    """One CUDA context of one core library (a path: ctypes loads each file once)."""

    def __init__(self, path, env=None):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        self.lib.fa_last_error.restype = ctypes.c_char_p
        self.lib.fa_context_info.restype = ctypes.c_char_p
        self.ctx = ctypes.c_void_p()
        saved = {key: os.environ.get(key) for key in (env or {})}
        try:
            for key, value in (env or {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self.check(self.lib.fa_context_create(2, 0, ctypes.byref(self.ctx)), "fa_context_create(CUDA)")
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if torch is not None:
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
        return Tensor(t.data_ptr(), FA_DTYPE[dtype_name(t.dtype)], b, n, h, d, sb, ss, sh)

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


def dtype_name(dtype):
    return {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]


# ---- the pure-Python parts (--self-test covers them) ------------------------------------------------

def parse_named(values, what):
    """["a=x", "b=y"] -> [("a", "x"), ("b", "y")], names unique, in order."""
    pairs = []
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{what}: expected NAME=VALUE, got {value!r}")
        if name in (n for n, _ in pairs):
            raise ValueError(f"{what}: {name!r} given twice")
        pairs.append((name, rest))
    return pairs


def round_order(names):
    """The order of one round's samples: the names, then the same reversed (base, new, new, base)."""
    return list(names) + list(reversed(names))


def median_ratio(numerators, denominators):
    """Median over rounds of numerator[r] / denominator[r]; NaN if no round has both."""
    ratios = [a / b for a, b in zip(numerators, denominators) if a > 0 and b > 0]
    return statistics.median(ratios) if ratios else math.nan


def grid(args):
    """The cells: (dtype, d, N, causal, batch) in the order they run."""
    seqlens = args.seqlens or ([1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384])
    return [(dt, d, n, causal, max(1, args.tokens // n))
            for dt in args.dtypes for d in args.dims for n in seqlens for causal in (False, True)
            if causal in args.causal_modes]


def passes(err, sdpa_err, floor):
    """A finite error at most twice SDPA's own, or under the floor."""
    if err is None or not math.isfinite(err):
        return False
    return err <= floor or (sdpa_err is not None and math.isfinite(sdpa_err) and err <= 2.0 * sdpa_err)


def fmt(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def self_test():
    assert parse_named(["base=a", "new=b=c"], "x") == [("base", "a"), ("new", "b=c")]
    for bad in (["base"], ["=a"], ["a="], ["a=1", "a=2"]):
        try:
            parse_named(bad, "x")
        except ValueError:
            continue
        raise AssertionError(f"parse_named accepted {bad}")
    assert round_order(["base", "new"]) == ["base", "new", "new", "base"]
    assert round_order(["a", "b", "c"]) == ["a", "b", "c", "c", "b", "a"]
    assert median_ratio([2.0, 3.0, 4.0], [1.0, 1.0, 1.0]) == 3.0
    assert median_ratio([1.0, 0.0], [2.0, 1.0]) == 0.5  # a round without a time does not count
    assert math.isnan(median_ratio([], []))
    assert passes(1e-4, None, 1e-3) and not passes(5e-3, 1e-3, 1e-3) and passes(1.9e-3, 1e-3, 1e-4)
    assert not passes(math.nan, 1.0, 1.0) and not passes(math.inf, 1.0, 1.0)
    args = build_parser().parse_args(["--quick"])
    finish_args(args)
    cells = grid(args)
    assert len(cells) == 16 and cells[0] == ("f16", 64, 1024, False, 16) and cells[-1] == ("bf16", 128, 4096, True, 4)
    args = build_parser().parse_args([])
    finish_args(args)
    assert len(grid(args)) == 40 and args.iters >= 30
    assert attention_flops(1, 4, 4, 1, True) == 4.0 * 10
    from types import SimpleNamespace
    cell = SimpleNamespace(dt="f16", d=128, n=4096, causal=True)
    entry = {"sdpa_tflops": 300.0, "base": dict(tflops=200.0, vs_sdpa=0.667, vs_base=math.nan),
             "new": dict(tflops=250.0, vs_sdpa=0.833, vs_base=1.25)}
    table = {mode: [(cell, entry, {"base": "ok", "new": "FAIL dq"})] for mode in MODES}
    text = markdown(table, [SimpleNamespace(name="base"), SimpleNamespace(name="new")])
    assert "| dtype | d | N | causal | SDPA | base | new | base/SDPA | new/SDPA | new/base | check |" in text
    assert "| f16 | 128 | 4096 | yes | 300.0 | 200.0 | 250.0 | 0.67 | 0.83 | 1.250 | new FAIL dq |" in text
    print("sdpa_compare: self-test passed")


# ---- on the GPU --------------------------------------------------------------------------------------

class Impl:
    """One plugin (a context of one core library) and its own output buffers for the current cell."""

    def __init__(self, name, lib, plugin_dir, kernels):
        self.name, self.lib_path, self.plugin_dir, self.kernels = name, lib, plugin_dir, kernels
        env = {"FLASHATTN_PLUGIN_DIR": plugin_dir}
        if kernels is not None:  # "default": the vendor's default family whatever the environment says
            env["FLASHATTN_GPU_KERNELS"] = "" if kernels == "default" else kernels
        self.fa = FlashAttn(lib, env)
        self.failed = None  # why this plugin stopped, for the current cell


def load_impls(args, tmp):
    """The plugins, base first. A folder without a core library gets a private copy of --lib's."""
    kernels = dict(parse_named(args.kernels, "--kernels"))
    specs = parse_named(args.plugin_dir, "--plugin-dir") or [("fa", os.path.dirname(os.path.abspath(args.lib)))]
    unknown = set(kernels) - {name for name, _ in specs}
    if unknown:
        raise ValueError(f"--kernels names {', '.join(sorted(unknown))}, which no --plugin-dir does")
    impls, failures, core_of, folder_core = [], [], {}, {}
    for name, folder in specs:
        folder = os.path.abspath(folder)
        lib = folder_core.get(folder) or os.path.join(folder, "libflashattn.so")
        if not os.path.exists(lib):
            lib = os.path.abspath(args.lib)
        if core_of.get(os.path.realpath(lib), folder) != folder:  # that core holds another folder's plugin
            os.makedirs(os.path.join(tmp, name))
            lib = shutil.copy(lib, os.path.join(tmp, name, "libflashattn.so"))
        core_of[os.path.realpath(lib)] = folder
        folder_core[folder] = lib
        try:
            impl = Impl(name, lib, folder, kernels.get(name))
        except (OSError, RuntimeError) as e:
            failures.append(f"{name} ({folder}): {e}")
            print(f"# {name}: cannot run: {e}")
            continue
        print(f"# {name}: {impl.fa.info()}")
        print(f"#   core {lib}, plugin folder {folder}")
        impls.append(impl)
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("libflashattn-cuda.so")})
    print(f"# plugins mapped in this process: {', '.join(mapped) or 'none'}")
    return impls, failures


def rel_err(x, ref):
    x = x.float()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison(*tensors):
    for t in tensors:
        t.fill_(math.nan)


def all_finite(*tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


class Cell:
    """One grid point: inputs, SDPA's tensors, each plugin's buffers, the reference slice."""

    def __init__(self, dt, d, n, causal, batch, heads, impls, check_heads):
        self.dt, self.d, self.n, self.causal, self.batch = dt, d, n, causal, batch
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
        shape = (batch, heads, n, d)
        self.q, self.k, self.v, self.dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
        self.qg, self.kg, self.vg = (t.clone().requires_grad_() for t in (self.q, self.k, self.v))
        self.desc = make_desc(causal)
        self.buffers = {}
        for impl in impls:
            out, dq, dk, dv, out_saved = (torch.empty_like(self.q) for _ in range(5))
            lse, lse_saved = (torch.empty((batch, heads, n), device="cuda", dtype=torch.float32) for _ in range(2))
            self.buffers[impl.name] = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, out_saved=out_saved, lse_saved=lse_saved)
        self.check_heads = min(check_heads, heads)
        self.flops = {mode: attention_flops(batch * heads, n, n, d, causal, mode) for mode in MODES}

    # SDPA, flash backend
    def sdpa(self, q, k, v):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def sdpa_calls(self):
        saved = self.sdpa(self.qg, self.kg, self.vg)
        inputs = (self.qg, self.kg, self.vg)

        def fwd():
            with torch.no_grad():
                self.sdpa(self.q, self.k, self.v)

        def fwdbwd():
            torch.autograd.grad(self.sdpa(*inputs), inputs, self.dout)

        def bwd():
            torch.autograd.grad(saved, inputs, self.dout, retain_graph=True)
        return {"fwd": (fwd, None), "fwdbwd": (fwdbwd, None), "bwd": (bwd, None)}

    # a plugin: each call poisons its outputs first and returns them for the finiteness check
    def plugin_calls(self, impl):
        b, fa, desc = self.buffers[impl.name], impl.fa, self.desc
        q, k, v, dout = self.q, self.k, self.v, self.dout

        def fwd_prep():
            poison(b["out"], b["lse"])
            return b["out"], b["lse"]

        def fwd():
            fa.forward(desc, q, k, v, b["out"], b["lse"])

        def fwdbwd_prep():
            poison(b["out"], b["lse"], b["dq"], b["dk"], b["dv"])
            return b["out"], b["lse"], b["dq"], b["dk"], b["dv"]

        def fwdbwd():
            fa.forward(desc, q, k, v, b["out"], b["lse"])
            fa.backward(desc, q, k, v, b["out"], dout, b["lse"], b["dq"], b["dk"], b["dv"])

        def bwd_prep():
            poison(b["dq"], b["dk"], b["dv"])
            return b["dq"], b["dk"], b["dv"]

        def bwd():  # from the forward the check stored
            fa.backward(desc, q, k, v, b["out_saved"], dout, b["lse_saved"], b["dq"], b["dk"], b["dv"])
        return {"fwd": (fwd, fwd_prep), "fwdbwd": (fwdbwd, fwdbwd_prep), "bwd": (bwd, bwd_prep)}

    def reference(self):
        """fp32 O, lse, dQ, dK, dV of batch 0's first check_heads heads (math backend, no TF32)."""
        h = self.check_heads
        q, k, v = (t[:1, :h].float().requires_grad_() for t in (self.q, self.k, self.v))
        dout = self.dout[:1, :h].float()
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        with torch.no_grad():
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
            if self.causal:
                scores.masked_fill_(torch.ones(self.n, self.n, device="cuda", dtype=torch.bool).triu(1), -math.inf)
            lse = torch.logsumexp(scores, dim=-1)
            del scores
        return dict(out=out.detach(), lse=lse, dq=dq, dk=dk, dv=dv)

    def sdpa_errors(self, ref):
        h = self.check_heads
        inputs = (self.qg, self.kg, self.vg)
        out = self.sdpa(*inputs)
        dq, dk, dv = torch.autograd.grad(out, inputs, self.dout)
        got = dict(out=out.detach(), dq=dq, dk=dk, dv=dv)
        return {key: rel_err(value[:1, :h], ref[key]) for key, value in got.items()}

    def check(self, impl, ref, sdpa_err):
        """Poisoned outputs, one forward and one backward; errors and the verdict."""
        b, h = self.buffers[impl.name], self.check_heads
        poison(b["out"], b["lse"], b["dq"], b["dk"], b["dv"])
        impl.fa.forward(self.desc, self.q, self.k, self.v, b["out"], b["lse"])
        impl.fa.backward(self.desc, self.q, self.k, self.v, b["out"], self.dout, b["lse"], b["dq"], b["dk"], b["dv"])
        torch.cuda.synchronize()
        b["out_saved"].copy_(b["out"])
        b["lse_saved"].copy_(b["lse"])
        err = {key: rel_err(b[key][:1, :h], ref[key]) for key in ("out", "dq", "dk", "dv")}
        lse = b["lse"][:1, :h]
        err["lse"] = (lse - ref["lse"]).abs().max().item() if torch.isfinite(lse).all() else math.inf
        unwritten = [key for key in ("out", "lse", "dq", "dk", "dv") if not all_finite(b[key])]
        floor = OUT_FLOOR[self.dt]
        bad = [key for key in ("out", "dq", "dk", "dv")
               if not passes(err[key], sdpa_err[key], floor * (1.0 if key == "out" else GRAD_FLOOR_FACTOR))]
        if not passes(err["lse"], None, LSE_TOL):
            bad.append("lse")
        verdict = "ok" if not bad and not unwritten else \
            "FAIL " + " ".join(bad + [f"{key}-not-finite" for key in unwritten if key not in bad])
        return err, verdict


def sample(call, prep):
    """Milliseconds of one call between two events, queued behind a GPU sleep; the poisoned outputs
    (prep's) must come back finite."""
    outputs = prep() if prep else ()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    call()
    end.record()
    end.synchronize()
    if outputs and not all_finite(*outputs):
        raise RuntimeError("an output is not finite after a timed call (unwritten or NaN)")
    return start.elapsed_time(end)


def run_cell(cell, impls, args, rows, table):
    label = f"{cell.dt:4} d={cell.d:<3} N={cell.n:<5} {'causal' if cell.causal else 'dense':6}"
    ref = cell.reference()
    sdpa_err = cell.sdpa_errors(ref)
    ok = True
    checks = {}
    for impl in impls:
        impl.failed = None
        try:
            checks[impl.name] = cell.check(impl, ref, sdpa_err)
        except RuntimeError as e:
            impl.failed = str(e)
            checks[impl.name] = ({}, f"FAIL {e}")
        if checks[impl.name][1] != "ok":
            ok = False
        err, verdict = checks[impl.name]
        print(f"# check {label} {impl.name}: {verdict}; rel err out {fmt(err.get('out'), '.1e')} dq {fmt(err.get('dq'), '.1e')} "
              f"dk {fmt(err.get('dk'), '.1e')} dv {fmt(err.get('dv'), '.1e')}, max|lse diff| {fmt(err.get('lse'), '.1e')} "
              f"(sdpa: out {sdpa_err['out']:.1e} dq {sdpa_err['dq']:.1e} dk {sdpa_err['dk']:.1e} dv {sdpa_err['dv']:.1e})")
    del ref
    live = [impl for impl in impls if impl.failed is None]
    sdpa = cell.sdpa_calls()
    calls = {impl.name: cell.plugin_calls(impl) for impl in live}

    def timed(name, mode):
        """A plugin's sample, or None after it failed (it is then left out of the cell)."""
        nonlocal ok
        if name not in calls:
            return None
        try:
            return sample(*calls[name][mode])
        except RuntimeError as e:
            failed = next(impl for impl in live if impl.name == name)
            failed.failed = f"{mode}: {e}"
            print(f"# {label} {name}: {failed.failed}")
            del calls[name]
            ok = False
            return None

    for mode in MODES:  # warm-up: module load, the caching allocator, clocks
        sample(*sdpa[mode])
        for impl in live:
            timed(impl.name, mode)
    times = {mode: {name: [] for name in ["sdpa"] + [impl.name for impl in live]} for mode in MODES}
    order = round_order([impl.name for impl in live])
    for _ in range(args.iters):
        for mode in MODES:
            times[mode]["sdpa"].append(sample(*sdpa[mode]))
            per_round = {name: [] for name in order}
            for name in order:
                t = timed(name, mode)
                if t is not None:
                    per_round[name].append(t)
            for name in per_round:
                if per_round[name]:
                    times[mode][name].append(statistics.fmean(per_round[name]))
                elif name in times[mode]:
                    times[mode][name].append(0.0)  # no time this round: median_ratio skips it
    base = impls[0].name if len(impls) > 1 and impls[0].name in times[MODES[0]] else None
    for mode in MODES:
        t_sdpa = times[mode]["sdpa"]
        med_sdpa = statistics.median(t_sdpa)
        entry = {"sdpa_tflops": cell.flops[mode] / med_sdpa / 1e9}
        for impl in impls:
            t = times[mode].get(impl.name)
            valid = [x for x in t or [] if x > 0]
            med = statistics.median(valid) if valid else math.nan
            vs_sdpa = median_ratio(t_sdpa, t) if valid else math.nan
            vs_base = median_ratio(times[mode][base], t) if valid and base and impl.name != base else math.nan
            err, verdict = checks[impl.name]
            entry[impl.name] = dict(ms=med, tflops=cell.flops[mode] / med / 1e9 if valid else math.nan,
                                    vs_sdpa=vs_sdpa, vs_base=vs_base)
            rows.append(dict(dtype=cell.dt, d=cell.d, n=cell.n, causal=int(cell.causal), batch=cell.batch,
                             heads=args.heads, mode=mode, impl=impl.name, kernels=impl.kernels or "",
                             median_ms=med, tflops=entry[impl.name]["tflops"], vs_sdpa=vs_sdpa, vs_base=vs_base,
                             rounds=len(valid), err_out=err.get("out"), err_lse=err.get("lse"), err_dq=err.get("dq"),
                             err_dk=err.get("dk"), err_dv=err.get("dv"), check=verdict))
        rows.append(dict(dtype=cell.dt, d=cell.d, n=cell.n, causal=int(cell.causal), batch=cell.batch,
                         heads=args.heads, mode=mode, impl="sdpa", kernels="flash", median_ms=med_sdpa,
                         tflops=entry["sdpa_tflops"], vs_sdpa=1.0, vs_base=math.nan, rounds=len(t_sdpa),
                         err_out=sdpa_err["out"], err_lse=None, err_dq=sdpa_err["dq"], err_dk=sdpa_err["dk"],
                         err_dv=sdpa_err["dv"], check="reference"))
        table[mode].append((cell, entry, {name: checks[name][1] for name in checks}))
    line = " | ".join(f"{mode} " + " ".join(f"{impl.name} {fmt(table[mode][-1][1][impl.name]['tflops'], '.1f')}"
                                            for impl in impls) + f" sdpa {table[mode][-1][1]['sdpa_tflops']:.1f}"
                      for mode in MODES)
    print(f"{label} {line} TFLOP/s")
    return ok


def markdown(table, impls):
    """One table per column (forward, forward+backward, backward only)."""
    names = [impl.name for impl in impls]
    base = names[0] if len(names) > 1 else None
    lines = []
    for mode in MODES:
        head = ["dtype", "d", "N", "causal", "SDPA"] + names + [f"{n}/SDPA" for n in names]
        head += [f"{n}/{base}" for n in names[1:]] if base else []
        head += ["check"]
        lines += [f"### {MODE_TITLE[mode]} (TFLOP/s; ratios are medians of per-round time ratios, > 1 is faster)", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for cell, entry, verdicts in table[mode]:
            row = [cell.dt, str(cell.d), str(cell.n), "yes" if cell.causal else "no", f"{entry['sdpa_tflops']:.1f}"]
            row += [fmt(entry[n]["tflops"], ".1f") for n in names]
            row += [fmt(entry[n]["vs_sdpa"], ".2f") for n in names]
            row += [fmt(entry[n]["vs_base"], ".3f") for n in names[1:]] if base else []
            row += ["; ".join(f"{n} {verdicts[n]}" for n in names if verdicts[n] != "ok") or "ok"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def profile(args, impls):
    """One warm-up forward+backward of the chosen plugin, then one between cudaProfilerStart and
    cudaProfilerStop (ncu --profile-from-start off sees that one's kernels and nothing else)."""
    impl = next((i for i in impls if i.name == args.profile), None)
    if impl is None:
        sys.exit(f"--profile {args.profile}: no such plugin (have: {', '.join(i.name for i in impls) or 'none'})")
    dt, d, n, causal, batch = grid(args)[0]
    cell = Cell(dt, d, n, causal, batch, args.heads, [impl], args.check_heads)
    fwdbwd, prep = cell.plugin_calls(impl)["fwdbwd"]
    sample(fwdbwd, prep)
    outputs = prep()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fwdbwd()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    written = all_finite(*outputs)
    print(f"# profiled {impl.name}: {dt} d={d} N={n} batch={batch} heads={args.heads} causal={causal}, one "
          f"forward+backward between cudaProfilerStart and cudaProfilerStop; outputs {'finite' if written else 'NOT FINITE'}")
    return 0 if written else 1


def build_parser():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--lib", default=os.path.join(here, "..", "..", "build", "src", "libflashattn.so"),
                        help="core library: timed alone without --plugin-dir; else copied for a folder without one")
    parser.add_argument("--plugin-dir", action="append", metavar="NAME=DIR", help="a plugin to time; the first is the base")
    parser.add_argument("--kernels", action="append", metavar="NAME=FAMILY", help="FLASHATTN_GPU_KERNELS for one plugin")
    parser.add_argument("--iters", type=int, default=30, help="rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="N = 1k and 4k only")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of f16, bf16")
    parser.add_argument("--dims", default="64,128", help="head dims, comma-separated")
    parser.add_argument("--seqlens", default="", help="N values, comma-separated (default by --quick)")
    parser.add_argument("--masks", default="dense,causal", help="dense, causal or both")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16384, help="batch * N (default 16k)")
    parser.add_argument("--check-heads", type=int, default=2, help="heads of batch 0 checked against fp32")
    parser.add_argument("--csv", help="write every number here (one row per cell, column and implementation)")
    parser.add_argument("--markdown", help="write the tables here as well")
    parser.add_argument("--profile", metavar="NAME", help="one forward+backward of NAME for ncu, nothing timed")
    parser.add_argument("--self-test", action="store_true", help="check the pure-Python parts (and load the plugins) and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser


def finish_args(args):
    args.dtypes = [x for x in args.dtypes.split(",") if x]
    args.dims = [int(x) for x in args.dims.split(",") if x]
    args.seqlens = [int(x) for x in args.seqlens.split(",") if x]
    masks = [x for x in args.masks.split(",") if x]
    if set(args.dtypes) - set(DTYPES) or set(masks) - {"dense", "causal"} or args.iters < 1:
        raise SystemExit("--dtypes takes f16, bf16; --masks dense, causal; --iters at least 1")
    args.causal_modes = {m == "causal" for m in masks}


def main():
    global torch, F
    args = build_parser().parse_args()
    finish_args(args)
    if args.self_test:
        self_test()
        if not args.plugin_dir:
            return 0
        with tempfile.TemporaryDirectory(prefix="sdpa_compare.") as tmp:  # contexts only, no torch
            impls, failures = load_impls(args, tmp)
        return 1 if failures else 0
    cells = grid(args)
    if args.dry_run:
        names = [n for n, _ in parse_named(args.plugin_dir, "--plugin-dir")] or ["fa"]
        print(f"# {len(cells)} cells x {args.iters} rounds; each round and column: sdpa, then {', '.join(round_order(names))}")
        for dt, d, n, causal, batch in cells:
            mib = batch * args.heads * n * d * 2 / 2**20
            print(f"{dt:4} d={d:<3} N={n:<5} {'causal' if causal else 'dense':6} batch={batch:<3} {mib:.0f} MiB per tensor")
        return 0
    import torch as torch_module
    import torch.nn.functional as functional
    torch, F = torch_module, functional
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: nothing to compare")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory(prefix="sdpa_compare.") as tmp:
        impls, failures = load_impls(args, tmp)
        if args.profile:
            return profile(args, impls)
        if not impls:
            print("# no plugin could run")
            return 1
        rows, table, ok = [], {mode: [] for mode in MODES}, not failures
        csv_file = open(args.csv, "w", newline="") if args.csv else None
        writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS) if csv_file else None
        if writer:
            writer.writeheader()
        print(f"# {len(cells)} cells, {args.iters} rounds; per round and column: sdpa, "
              f"then {', '.join(round_order([i.name for i in impls]))}")
        for dt, d, n, causal, batch in cells:
            try:
                ok &= run_cell(Cell(dt, d, n, causal, batch, args.heads, impls, args.check_heads), impls, args, rows, table)
            except RuntimeError as e:  # out of memory, or SDPA refusing the cell: the next cell still runs
                print(f"# {dt} d={d} N={n} causal={causal}: {type(e).__name__}: {e}")
                ok = False
            torch.cuda.empty_cache()
            # Written after every cell, so that a run stopped by a time limit leaves what it measured.
            if writer:
                for row in rows:
                    writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
                csv_file.flush()
            rows.clear()
            if args.markdown:
                with open(args.markdown, "w") as f:
                    f.write(markdown(table, impls) + "\n")
        if csv_file:
            csv_file.close()
    print()
    print(markdown(table, impls))
    for failure in failures:
        print(f"# not run: {failure}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
