#!/usr/bin/env python3
"""bench/cpu/check_targets.py's judging on made-up runs: medians over rounds, both comparisons at
and beside their thresholds, the cells it cannot measure (no PyTorch, runs from before the FMA
probe) and the targets a machine cannot judge. No benchmark runs here (bench/meson.build's smoke
test runs them)."""
import csv
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "cpu"))
import check_targets as ct  # noqa: E402

FA_COLUMNS = ("pass,n,d,heads,threads,mask,flash_ms,flash_gflops,flash_sgemm_fraction,flash_extra_mib,std_ms,std_gflops,"
              "std_extra_mib,speedup,sgemm_gflops,isa,dtype,time_vs_f32,torch_ms,speedup_vs_torch,fma_peak_gflops,"
              "flash_fma_fraction,l1_gemm_gflops,flash_l1_fraction,layout").split(",")
AVX512 = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: fma avx2 avx512f\n"
AVX2 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fma avx2\n"


def fa_row(ps, n, d, mask, dtype="f32", vs_torch=0.0, speedup=0.0, vs_f32=1.0, peak=0.5, of_sgemm=0.5, fma=True):
    row = dict.fromkeys(FA_COLUMNS, "0")
    row.update({"pass": ps, "n": n, "d": d, "mask": mask, "dtype": dtype, "layout": "bnhd", "flash_ms": 10,
                "std_ms": 10 * speedup, "speedup": speedup, "time_vs_f32": vs_f32, "torch_ms": 10 * vs_torch,
                "speedup_vs_torch": vs_torch, "flash_sgemm_fraction": of_sgemm,
                "flash_fma_fraction": peak if fma else ""})
    return row


class Judging(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, rows, columns=FA_COLUMNS):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
        return path

    def judged(self, runs, machine_text=AVX512, issues=(15, 16, 20)):
        data = ct.load({run: [self.write(f"{run}-{i}.csv", rows, columns) for i, rows in enumerate(rounds)]
                        for run, (rounds, columns) in runs.items()})
        machine = ct.Machine(machine_text, arch="x86_64")
        return {t.text: (v, cells) for t, v, cells in ct.judge(ct.targets(machine, "bnhd", set(issues)), data,
                                                                 ct.missing_reasons(data))}

    def grid_rounds(self, torch_values):
        """Three rounds of the grid run; torch_values(round, pass, n, d, mask) gives each cell's ratio."""
        return [[fa_row(ps, n, d, m, vs_torch=torch_values(r, ps, n, d, m), speedup=1.0, peak=0.9)
                 for ps in ("fwd", "fwd+bwd") for n in ct.GRID_N for d in (64, 128) for m in ("dense", "causal")]
                for r in range(3)]

    def test_median_over_rounds_decides(self):
        # one cell below 1.10 in two rounds of three: its median (1.05) fails; another cell below in
        # one round of three passes on its median
        def torch_values(r, ps, n, d, m):
            if (ps, n, d, m) == ("fwd", 2048, 128, "dense"):
                return [1.05, 1.30, 1.00][r]
            if (ps, n, d, m) == ("fwd", 1024, 64, "causal"):
                return [1.00, 1.20, 1.10][r]
            return 1.20
        out = self.judged({"grid": (self.grid_rounds(torch_values), FA_COLUMNS)}, issues=[16])
        verdict, cells = out["forward >= 1.10x PyTorch SDPA (N 512-4096, d 64/128, dense and causal)"]
        self.assertEqual(verdict, "NOT MET")
        by_label = {c.label: (med, lo, hi, v) for c, med, lo, hi, v in cells}
        self.assertEqual(by_label["fwd N 2048 d 128 dense"], (1.05, 1.00, 1.30, "NOT MET"))
        self.assertEqual(by_label["fwd N 1024 d 64 causal"][3], "met")  # median exactly 1.10
        self.assertEqual(sum(v == "met" for *_, v in cells), 15)
        verdict, _ = out["forward+backward >= 1.10x PyTorch SDPA (N 1024-4096, d 64/128, dense and causal)"]
        self.assertEqual(verdict, "met")

    def test_no_torch_is_not_measured(self):
        out = self.judged({"grid": (self.grid_rounds(lambda *a: 0.0), FA_COLUMNS)}, issues=[16])
        verdict, cells = out["forward >= 1.10x PyTorch SDPA (N 512-4096, d 64/128, dense and causal)"]
        self.assertEqual(verdict, "not measured")
        self.assertIn("no PyTorch column", cells[0][4])
        self.assertEqual(out["N 512 forward >= 1.0x standard attention"][0], "met")

    def test_at_most_targets(self):
        rows = [fa_row(ps, 2048, d, "dense", dtype=t, vs_f32=1.0 if t == "f16" else 1.01)
                for ps in ("fwd", "fwd+bwd") for d in (64, 128) for t in ("f32", "f16", "bf16")]
        out = self.judged({"types": ([rows], FA_COLUMNS)}, issues=[16])
        verdict, cells = out["f16 and bf16 inputs: time <= 1.0x the f32 time (N 2048, dense)"]
        self.assertEqual(verdict, "NOT MET")
        self.assertEqual({v for c, *_, v in cells if c.key[4] == "f16"}, {"met"})
        self.assertEqual({v for c, *_, v in cells if c.key[4] == "bf16"}, {"NOT MET"})

    def test_peak_needs_the_fma_probe(self):
        rows = [fa_row(ps, n, d, m, peak=0.95, fma=n != 1024) for ps in ("fwd", "fwd+bwd") for n in (1024, 4096)
                for d in (64, 128) for m in ("dense", "causal")]
        out = self.judged({"grid": ([rows], FA_COLUMNS)}, issues=[20])
        self.assertEqual(out["widest ISA, N 1024: >= 0.75 (d 128) / 0.70 (d 64) of the FMA peak, fwd and fwd+bwd, "
                             "dense and causal"][0], "not measured")
        self.assertEqual(out["widest ISA, N 4096: >= 0.85 (d 128) / 0.80 (d 64) of the FMA peak, fwd and fwd+bwd, "
                             "dense and causal (causal counts the visible scores)"][0], "met")

    def test_thresholds_by_head_dimension(self):
        rows = [fa_row(ps, 4096, d, "dense", peak=0.82, of_sgemm=0.82) for ps in ("fwd", "fwd+bwd") for d in (64, 128)]
        text = "AVX2 kernels, N 4096 dense: >= 0.80 (d 128) / 0.75 (d 64) of the AVX2 FMA peak, fwd and fwd+bwd"
        self.assertEqual(self.judged({"avx2": ([rows], FA_COLUMNS)}, issues=[20])[text][0], "met")
        rows = [fa_row(ps, 4096, d, "dense", peak=0.78) for ps in ("fwd", "fwd+bwd") for d in (64, 128)]
        verdict, cells = self.judged({"avx2": ([rows], FA_COLUMNS)}, issues=[20])[text]
        self.assertEqual(verdict, "NOT MET")
        self.assertEqual({c.key[2]: v for c, *_, v in cells}, {64: "met", 128: "NOT MET"})

    def test_avx2_sgemm_target_counts_only_an_avx2_only_cpu(self):
        rows = [fa_row("fwd", n, d, "dense", of_sgemm=0.9) for n in (1024, 2048, 4096) for d in (64, 128)]
        text = "AVX2 forward dense >= 0.80 of the same run's sgemm rate (d 64/128, N 1024-4096)"
        on_avx512 = self.judged({"avx2": ([rows], FA_COLUMNS)}, AVX512, issues=[16])[text][0]
        self.assertTrue(on_avx512.startswith("not judged: the issue counts an AVX2-only CPU"), on_avx512)
        self.assertEqual(self.judged({"avx2": ([rows], FA_COLUMNS)}, AVX2, issues=[16])[text][0], "met")
        self.assertEqual(ct.runs_needed(ct.Machine("flags\t: neon\n", arch="aarch64"), [16, 20]), ["grid", "types"])

    def test_modifiers(self):
        columns = "variant,n,d,heads,threads,pass,ms,x_plain,x_array_sum".split(",")

        def rounds(softcap):
            return [[{"variant": v, "n": 2048, "d": 64, "heads": 8, "threads": 2, "pass": "fwd", "ms": 1,
                      "x_plain": {"softcap": s}.get(v, 1.0),
                      # a bias row with no extra time at all reads inf (and counts): f16's in round 1
                      "x_array_sum": (float("inf") if v == "bias [H,N,N] f16" and s == softcap[0] else 1.1)
                      if v.startswith("bias") else 0}
                     for v in ["plain", "softcap", "alibi", "sinks", "bias [H,N,N] f32", "bias [H,N,N] f16",
                               "bias [H,N,N] bf16"]] for s in softcap]
        out = self.judged({"modifiers-d64": (rounds([1.12, 1.08, 1.09]), columns),
                           "modifiers-d128": (rounds([1.12, 1.11, 1.02]), columns)}, issues=[15])
        self.assertEqual(out["softcap, ALiBi, sinks forward <= 1.10x the plain forward (N 2048, d 64)"][0], "met")
        self.assertEqual(out["softcap, ALiBi, sinks forward <= 1.10x the plain forward (N 2048, d 128)"][0], "NOT MET")
        bias = [(v, cells) for text, (v, cells) in out.items() if text.startswith("the bias forward")]
        self.assertEqual(bias[0][0], "met")
        self.assertEqual([(c.key, med, high) for c, med, _, high, _ in bias[0][1] if c.key == "bias [H,N,N] f16"],
                         [("bias [H,N,N] f16", 1.1, float("inf"))])

    def test_judging_kept_runs(self):
        # --from DIR: the rounds an earlier --keep left, judged without running anything
        rows = [fa_row("fwd", 512, d, m, speedup=0.9 if d == 128 else 1.2) for d in (64, 128) for m in ("dense", "causal")]
        for r in (1, 2):
            self.write(f"grid-round{r}.csv", rows)
            self.write(f"types-round{r}.csv", rows)
        report = os.path.join(self.dir.name, "report.md")
        with open(os.devnull, "w") as null:
            stdout, sys.stdout = sys.stdout, null
            try:
                status = ct.main(["--from", self.dir.name, "--issues", "16", "--report", report, "--strict"])
            finally:
                sys.stdout = stdout
        self.assertEqual(status, 1)  # --strict: a judged target not met
        with open(report) as f:
            text = f.read()
        self.assertIn("2 round(s)", text)
        self.assertIn(f"check_targets.py --from {self.dir.name} --issues 16", text)  # the command judged
        self.assertIn("| fwd N 512 d 128 dense | 0.90 | 0.90-0.90 | >= 1.00 | NOT MET |", text)
        self.assertIn("| fwd N 512 d 64 causal | 1.20 | 1.20-1.20 | >= 1.00 | met |", text)


if __name__ == "__main__":
    unittest.main()
