#!/usr/bin/env python3
"""The CPU speed targets of issues 15, 16 and 20, measured on this machine and judged in one command.

Each round runs fa-bench (and fa-bench-modifiers) over the cells the issues name; the rounds
repeat so that a noisy minute hits every cell alike, and each cell is judged on the median of its
per-round values. Every value is a ratio measured within one run: against PyTorch SDPA, standard
attention, the f32 time, the plain forward, or the same run's FMA peak or sgemm rate. Usage:

    bench/cpu/check_targets.py [--build build] [--rounds 3] [--threads 2] [--heads 8]
                               [--layout bnhd|bhnd] [--issues 15,16,20] [--keep DIR]
                               [--report FILE] [--strict] [--smoke] [--dry-run] [--from DIR]

It needs a build with the benchmarks (meson option `bench`, on by default) and, for the PyTorch
targets, `$FA_BENCH_PYTHON -c 'import torch'` working (fa-bench's PyTorch column). It prints a
markdown report: the machine, then each target with every cell's median and range over the rounds
and its verdict: met, NOT MET, not measured (and why), or shown but not judged (a target this
machine cannot judge, e.g. the AVX2 one that counts only an AVX2-only CPU). About 2-3 minutes a
round on a 2-core machine. --keep DIR keeps every run's CSV and output (--from DIR judges them
again, running nothing); --strict exits 1 when a
judged target is not met; --smoke runs one small round of every command (N 512, d 64) to check the
pipeline, and its verdicts mean nothing; --dry-run prints the commands.
"""
import argparse
import csv
import datetime
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import median_rounds  # noqa: E402  (fa-bench's CSV, read one way for both scripts)

GRID_N = [512, 1024, 2048, 4096]

# The runs of one round: program, its arguments (fa-bench's common ones are added), environment,
# and the issues that need it.
RUNS = {
    "grid": ("fa-bench", ["--n", ",".join(map(str, GRID_N)), "--d", "64,128", "--mask", "both", "--pass", "fwd,fwdbwd",
                          "--std-max-n", "512"], {}, {16, 20}),
    "types": ("fa-bench", ["--n", "2048", "--d", "64,128", "--mask", "dense", "--pass", "fwd,fwdbwd",
                           "--dtype", "f32,f16,bf16", "--torch", "off", "--std-max-n", "0"], {}, {16}),
    "avx2": ("fa-bench", ["--n", "1024,2048,4096", "--d", "64,128", "--mask", "dense", "--pass", "fwd,fwdbwd",
                          "--torch", "off", "--std-max-n", "0"], {"FLASHATTN_CPU_ISA": "avx2"}, {16, 20}),
    "modifiers-d64": ("fa-bench-modifiers", ["--n", "2048", "--d", "64", "--rounds", "1"], {}, {15}),
    "modifiers-d128": ("fa-bench-modifiers", ["--n", "2048", "--d", "128", "--rounds", "1"], {}, {15}),
}
SMOKE_ARGS = {"--n": "512", "--d": "64", "--reps": "1", "--min-time": "0", "--torch": "off"}
MODIFIERS = ["softcap", "alibi", "sinks"]
BIASES = ["bias [H,N,N] f32", "bias [H,N,N] f16", "bias [H,N,N] bf16"]


class Machine:
    """What the CPU is and which targets it can judge."""

    def __init__(self, cpuinfo_text=None, arch=None):
        if cpuinfo_text is None:
            try:
                with open("/proc/cpuinfo") as f:
                    cpuinfo_text = f.read()
            except OSError:
                cpuinfo_text = ""
        fields = {}
        for line in cpuinfo_text.splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
        self.flags = set(fields.get("flags", "").split())
        self.arch = arch or platform.machine()
        self.x86 = self.arch in ("x86_64", "AMD64", "i686")
        self.avx2 = self.x86 and {"avx2", "fma"} <= self.flags
        self.avx512 = self.x86 and "avx512f" in self.flags
        self.name = fields.get("model name") or platform.processor() or self.arch
        self.description = self.name
        if "cpu family" in fields:
            self.description += f" ({fields.get('vendor_id', '?')}, family {fields['cpu family']}, model {fields.get('model', '?')})"
        isa = "AVX-512" if self.avx512 else "AVX2 (no AVX-512)" if self.avx2 else "no AVX2" if self.x86 else self.arch
        self.description += f", {os.cpu_count()} CPUs, {isa}"


class Cell:
    def __init__(self, label, run, key, metric, op, threshold):
        self.label, self.run, self.key, self.metric, self.op, self.threshold = label, run, key, metric, op, threshold


class Target:
    def __init__(self, issue, text, cells, not_judged=None):
        self.issue, self.text, self.cells, self.not_judged = issue, text, cells, not_judged


def fa_cell(run, ps, n, d, mask, metric, op, threshold, layout, dtype="f32"):
    label = f"{ps} N {n} d {d} {mask}" + (f" {dtype}" if dtype != "f32" else "")
    return Cell(label, run, (ps, n, d, mask, dtype, layout), metric, op, threshold)


def targets(machine, layout, issues):
    """The issues' targets as cells to judge (the issues' text is their source; this is their one
    executable copy)."""
    out = []
    cell = lambda *a, **k: fa_cell(*a, layout=layout, **k)  # noqa: E731
    if 15 in issues:
        for d in (64, 128):
            out.append(Target(15, f"softcap, ALiBi, sinks forward <= 1.10x the plain forward (N 2048, d {d})",
                              [Cell(f"{m} d {d}", f"modifiers-d{d}", m, "x_plain", "<=", 1.10) for m in MODIFIERS]))
        out.append(Target(15, "the bias forward reads the bias at full memory speed (its extra time over its bytes "
                              "at the same run's array-sum rate, >= 1.0; N 2048, d 64)",
                          [Cell(b, "modifiers-d64", b, "x_array_sum", ">=", 1.0) for b in BIASES]))
    if 16 in issues:
        out.append(Target(16, "forward >= 1.10x PyTorch SDPA (N 512-4096, d 64/128, dense and causal)",
                          [cell("grid", "fwd", n, d, m, "vs_torch", ">=", 1.10)
                           for d in (64, 128) for n in GRID_N for m in ("dense", "causal")]))
        out.append(Target(16, "forward+backward >= 1.10x PyTorch SDPA (N 1024-4096, d 64/128, dense and causal)",
                          [cell("grid", "fwd+bwd", n, d, m, "vs_torch", ">=", 1.10)
                           for d in (64, 128) for n in GRID_N[1:] for m in ("dense", "causal")]))
        avx2_only = None
        if not machine.avx2:
            avx2_only = "this CPU has no AVX2"
        elif machine.avx512:
            avx2_only = ("the issue counts an AVX2-only CPU; here the AVX2 kernels are forced on an AVX-512 CPU "
                         "whose sgemm uses AVX-512")
        out.append(Target(16, "AVX2 forward dense >= 0.80 of the same run's sgemm rate (d 64/128, N 1024-4096)",
                          [cell("avx2", "fwd", n, d, "dense", "of_sgemm", ">=", 0.80)
                           for d in (64, 128) for n in GRID_N[1:]], avx2_only))
        out.append(Target(16, "N 512 forward >= 1.0x standard attention",
                          [cell("grid", "fwd", 512, d, m, "speedup", ">=", 1.0) for d in (64, 128)
                           for m in ("dense", "causal")]))
        out.append(Target(16, "f16 and bf16 inputs: time <= 1.0x the f32 time (N 2048, dense)",
                          [cell("types", ps, 2048, d, "dense", "vs_f32", "<=", 1.0, dtype=t)
                           for d in (64, 128) for ps in ("fwd", "fwd+bwd") for t in ("f16", "bf16")]))
    if 20 in issues:
        widest = lambda d, hi, lo: hi if d == 128 else lo  # noqa: E731
        out.append(Target(20, "widest ISA, N 4096: >= 0.85 (d 128) / 0.80 (d 64) of the FMA peak, fwd and fwd+bwd, "
                              "dense and causal (causal counts the visible scores)",
                          [cell("grid", ps, 4096, d, m, "peak", ">=", widest(d, 0.85, 0.80))
                           for d in (64, 128) for ps in ("fwd", "fwd+bwd") for m in ("dense", "causal")]))
        out.append(Target(20, "widest ISA, N 1024: >= 0.75 (d 128) / 0.70 (d 64) of the FMA peak, fwd and fwd+bwd, "
                              "dense and causal",
                          [cell("grid", ps, 1024, d, m, "peak", ">=", widest(d, 0.75, 0.70))
                           for d in (64, 128) for ps in ("fwd", "fwd+bwd") for m in ("dense", "causal")]))
        out.append(Target(20, "AVX2 kernels, N 4096 dense: >= 0.80 (d 128) / 0.75 (d 64) of the AVX2 FMA peak, "
                              "fwd and fwd+bwd",
                          [cell("avx2", ps, 4096, d, "dense", "peak", ">=", widest(d, 0.80, 0.75))
                           for d in (64, 128) for ps in ("fwd", "fwd+bwd")],
                          None if machine.avx2 else "this CPU has no AVX2"))
    return out


def runs_needed(machine, issues):
    return [name for name, (_, _, _, need) in RUNS.items()
            if need & set(issues) and (name != "avx2" or machine.avx2)]


def command(build, name, args):
    """The run's command line and environment; --smoke shrinks it to one small case."""
    prog, extra, env, _ = RUNS[name]
    options = dict(zip(extra[::2], extra[1::2]))
    options.update({"--threads": str(args.threads), "--heads": str(args.heads)})
    if prog == "fa-bench":
        options.update({"--layout": args.layout, "--stat": "median"})
        if args.smoke:
            options.update(SMOKE_ARGS)
        path = os.path.join(build, "bench", prog)
    else:
        if args.smoke:
            options.update({"--n": "256", "--d": "64"})
        path = os.path.join(build, "bench", "modifiers", prog)
    return [path] + [x for pair in options.items() for x in pair], dict(os.environ, **env)


def round_file(work, run, r, ext="csv"):
    """Where a round of a run keeps its CSV (or its output, ext "out"): --keep writes, --from reads."""
    return os.path.join(work, f"{run}-round{r}.{ext}")


def shown(run, cmd):
    """The command as a shell would take it, the run's environment first."""
    env = " ".join(f"{k}={v}" for k, v in RUNS[run][2].items())
    return (env + " " if env else "") + " ".join(shlex.quote(a) for a in cmd)


def load_modifiers(paths):
    """fa-bench-modifiers' --csv over the rounds: {variant: {"x_plain": [...], "x_array_sum": [...]}}."""
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                entry = rows.setdefault(r["variant"], {"x_plain": [], "x_array_sum": []})
                entry["x_plain"].append(float(r["x_plain"]))
                rate = float(r["x_array_sum"])  # 0: a row without a read rate
                if rate != 0:  # no extra time at all is inf (below zero, as the first --csv wrote it)
                    entry["x_array_sum"].append(rate if rate > 0 else float("inf"))
    return rows


def load(csv_paths):
    """{run: rows} from {run: [csv per round]}: fa-bench's rows by median_rounds.load, the
    modifiers' by variant."""
    return {run: (load_modifiers(paths) if run.startswith("modifiers") else median_rounds.load(paths))
            for run, paths in csv_paths.items()}


def judge_cell(c, data, why_missing):
    """(median, low, high, verdict) of one cell; verdict: 'met', 'NOT MET' or 'not measured: ...'."""
    values = data.get(c.run, {}).get(c.key, {}).get(c.metric, [])
    if c.metric == "peak" and values and not data[c.run][c.key].get("of_fma"):
        values = []  # runs from before fa-bench's FMA probe: their fraction is of the sgemm rate
    if not values:
        return None, None, None, "not measured: " + why_missing.get((c.run, c.metric), "no such row in the runs")
    med = statistics.median(values)
    ok = med >= c.threshold if c.op == ">=" else med <= c.threshold
    return med, min(values), max(values), "met" if ok else "NOT MET"


def judge(targets_list, data, why_missing):
    """[(target, verdict, [(cell, median, low, high, cell verdict)])]; a target's verdict is 'met'
    when every cell is, 'NOT MET' when a measured cell is not, 'incomplete' when some cells were
    not measured and the rest met, 'not judged: ...' for a machine that cannot judge it."""
    out = []
    for t in targets_list:
        cells = [(c,) + judge_cell(c, data, why_missing) for c in t.cells]
        verdicts = [v for *_, v in cells]
        if t.not_judged:
            verdict = "not judged: " + t.not_judged
        elif "NOT MET" in verdicts:
            verdict = "NOT MET"
        elif all(v == "met" for v in verdicts):
            verdict = "met"
        elif any(v == "met" for v in verdicts):
            verdict = "incomplete"
        else:
            verdict = "not measured"
        out.append((t, verdict, cells))
    return out


def missing_reasons(data):
    """Why a metric may have no values: runs without the PyTorch column or standard attention."""
    why = {}
    grid = data.get("grid", {})
    if grid and not any(e["vs_torch"] for e in grid.values()):
        python = os.environ.get("FA_BENCH_PYTHON", "python3")
        why[("grid", "vs_torch")] = f"no PyTorch column (`{python} -c 'import torch'` fails; set FA_BENCH_PYTHON)"
    if grid and not any(e["speedup"] for e in grid.values()):
        why[("grid", "speedup")] = "no standard attention (fa-bench built without OpenBLAS)"
    return why


def fmt(x):
    return "-" if x is None else f"{x:.2f}"


def report(machine, judged, data, args, header, rounds_done):
    lines = [f"# The CPU targets of issues {', '.join(map(str, args.issues))} on this machine", ""]
    lines.append(f"- machine: {machine.description}")
    lines.append(f"- {rounds_done} round(s) of every run, {args.threads} threads, {args.heads} heads, layout "
                 f"{args.layout}, f32 unless a cell says otherwise; each cell's value is the median of its per-round "
                 f"values (range: lowest-highest)" + ("; SMOKE RUN: the verdicts mean nothing" if args.smoke else ""))
    lines.append(f"- written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by "
                 f"bench/cpu/check_targets.py {' '.join(shlex.quote(a) for a in args.argv)}")
    if header:
        lines += ["", "fa-bench's header (first round):", "", "```"] + header + ["```"]
    lines += ["", "| issue | target | verdict | cells met |", "|---|---|---|---|"]
    for t, verdict, cells in judged:
        met = sum(1 for *_, v in cells if v == "met")
        lines.append(f"| {t.issue} | {t.text} | {verdict} | {met} of {len(cells)} |")
    for t, verdict, cells in judged:
        # beside a fraction of the FMA peak, the fraction of what the cores gave an L1-resident
        # product around the same row (fa-bench's `of L1`): how much of a shortfall is the machine's
        of_l1 = any(c.metric == "peak" for c in t.cells)
        lines += ["", f"## Issue {t.issue}: {t.text}", "", f"Verdict: **{verdict}**", "",
                  "| cell | median | range | target | |" + (" of L1 (median) |" if of_l1 else ""),
                  "|---|---|---|---|---|" + ("---|" if of_l1 else "")]
        for c, med, low, high, v in cells:
            rng = "-" if low is None else f"{low:.2f}-{high:.2f}"
            line = f"| {c.label} | {fmt(med)} | {rng} | {c.op} {c.threshold:.2f} | {v} |"
            if of_l1:
                l1 = data.get(c.run, {}).get(c.key, {}).get("of_l1")
                line += f" {fmt(statistics.median(l1)) if l1 else '-'} |"
            lines.append(line)
    return "\n".join(lines) + "\n"


def fa_bench_header(stdout):
    """fa-bench's lines above its table (machine, kernels, probes, PyTorch), without progress lines."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("pass "):
            break
        if line.strip():
            out.append(line)
    return out


def judge_kept(args, machine, runs):
    """--from DIR: the report of the runs kept there (those of the first round, over every round
    that has them all), nothing run; a run not kept leaves its cells not measured. The machine is
    this one: judge on the machine that ran them."""
    runs = [run for run in runs if os.path.exists(round_file(args.from_dir, run, 1))]
    if not runs:
        sys.exit(f"check_targets: no run's round 1 CSV in {args.from_dir}")
    with open(round_file(args.from_dir, runs[0], 1), newline="") as f:
        first = next(csv.DictReader(f), {})  # the report states the runs' threads, heads and layout
    args.threads, args.heads = first.get("threads", args.threads), first.get("heads", args.heads)
    args.layout = first.get("layout") or args.layout
    csv_paths, r = {run: [] for run in runs}, 1
    while all(os.path.exists(round_file(args.from_dir, run, r)) for run in runs):
        for run in runs:
            csv_paths[run].append(round_file(args.from_dir, run, r))
        r += 1
    header = []
    if os.path.exists(round_file(args.from_dir, "grid", 1, "out")):
        with open(round_file(args.from_dir, "grid", 1, "out")) as f:
            header = fa_bench_header(f.read())
    return finish(args, machine, load(csv_paths), header, r - 1)


def finish(args, machine, data, header, rounds):
    """Judge, print and write the report; the exit status (--strict: 1 on a target not met)."""
    judged = judge(targets(machine, args.layout, args.issues), data, missing_reasons(data))
    text = report(machine, judged, data, args, header, rounds)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 1 if args.strict and any(v == "NOT MET" for _, v, _ in judged) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layout", choices=["bnhd", "bhnd"], default="bnhd")
    p.add_argument("--issues", default="15,16,20")
    p.add_argument("--keep")
    p.add_argument("--report")
    p.add_argument("--strict", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="judge the runs an earlier --keep DIR kept, running nothing")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # for the report
    try:
        args.issues = sorted({int(x) for x in args.issues.split(",")})
    except ValueError:
        p.error("--issues: a comma-separated list of 15, 16, 20")
    if not set(args.issues) <= {15, 16, 20} or not args.issues:
        p.error("--issues: a comma-separated list of 15, 16, 20")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    if args.smoke:
        args.rounds = 1
    machine = Machine()
    runs = runs_needed(machine, args.issues)
    if args.from_dir:
        return judge_kept(args, machine, runs)
    if args.dry_run:  # the commands of one round
        for run in runs:
            cmd, _ = command(args.build, run, args)
            print(shown(run, cmd + ["--csv", round_file(args.keep or "WORKDIR", run, 1)]))
        return 0
    work = args.keep or tempfile.mkdtemp(prefix="check-targets-")
    os.makedirs(work, exist_ok=True)
    csv_paths = {run: [] for run in runs}
    header = []
    for r in range(1, args.rounds + 1):
        for run in runs:
            cmd, env = command(args.build, run, args)
            cmd += ["--csv", round_file(work, run, r)]
            print(f"[round {r}/{args.rounds}] {run}: {shown(run, cmd)}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            with open(round_file(work, run, r, "out"), "w") as f:
                f.write(done.stdout + done.stderr)
            if done.returncode != 0:
                sys.exit(f"check_targets: {run} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            if run == "grid" and r == 1:
                header = fa_bench_header(done.stdout)
            csv_paths[run].append(round_file(work, run, r))
    data = load(csv_paths)
    empty = [run for run in runs if not data[run]]
    if empty:
        sys.exit(f"check_targets: no rows in the CSVs of {', '.join(empty)} (in {work}): the benchmark's CSV changed?")
    status = finish(args, machine, data, header, args.rounds)
    if args.keep:
        print(f"runs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work)
    return status


if __name__ == "__main__":
    sys.exit(main())
