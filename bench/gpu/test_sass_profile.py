#!/usr/bin/env python3
"""Self-test of sass_profile.py on a hand-written SASS listing (testdata/forward_loop.sass): no
plugin, tools or GPU needed. The listing's loop (header 0x30) holds a copy loop (0x50-0x80, one
LDGSTS per pass), two HMMA, one LDSM, a masking branch (0xd0-0xf0, skipped by the plain tile),
MUFU.EX2, LDL and STL; counted by hand:
  steady  0x30-0x40, 0x50-0x80, 0x90-0xc0, 0x100-0x140: 15 instructions (43 with the copy loop run
          8 times: fa_tc.forward at W 64 copies 8 chunks per thread per iteration)
  masked  the same and 0xd0-0xf0: 18 (46)
usage: test_sass_profile.py [PLAN_PROGRAM]  (the plan program's own output is checked when given)
"""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sass_profile as sp  # noqa: E402

SASS = os.path.join(HERE, 'testdata', 'forward_loop.sass')
RES = os.path.join(HERE, 'testdata', 'forward_loop.res')
PLAN_PROGRAM = None
# fa_tc_smem_bytes(64) and 2 tiles * 64 rows * 8 chunks / 128 threads, as src/gpu/tc_plan.h gives
PLAN = {('fa_tc.forward', 64): {'threads': 128, 'smem_dynamic': 24576, 'copies': 8}}


class Args:
    arch = None
    filter = None
    all = False


def rows(plan=PLAN):
    with open(SASS) as f:
        funcs = sp.parse_sass(f.read().splitlines())
    with open(RES) as f:
        res = sp.parse_res_usage(f.read().splitlines())
    return sp.profile(funcs, res, plan, Args())


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = sp.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


class Profile(unittest.TestCase):
    def test_demangle(self):
        self.assertEqual(sp.demangle('_ZN5fa_tc7forwardINS_14mma_sync_layerIL8fa_dtype1EEELi64EEEv13fa_gpu_params'),
                         'fa_tc::forward<fa_tc::mma_sync_layer<(fa_dtype)1>, 64>(fa_gpu_params)')
        self.assertEqual(sp.demangle('_ZN8fa_merge14merge_partialsE19fa_gpu_merge_params'),
                         'fa_merge::merge_partials(fa_gpu_merge_params)')
        self.assertEqual(sp.demangle('not_mangled'), 'not_mangled')

    def test_resources_and_occupancy(self):
        (r,) = rows()
        self.assertEqual((r['kind'], r['dtype'], r['W'], r['arch']), ('forward', 'f16', 64, 'sm_90'))
        self.assertEqual((r['regs'], r['stack'], r['smem'], r['threads']), (168, 16, 24576, 128))
        # 168 registers: 5376 per warp, 12 warps, 3 blocks of 4 warps
        self.assertEqual((r['blocks_per_sm'], r['warps_per_sm'], r['limiter']), (3, 12, 'regs'))

    def test_occupancy_limits(self):
        self.assertEqual(sp.occupancy('sm_90', 255, 0, 128)['blocks_per_sm'], 2)
        self.assertEqual(sp.occupancy('sm_90', 16, 0, 128), {'blocks_per_sm': 16, 'warps_per_sm': 64, 'limiter': 'thr'})
        self.assertEqual(sp.occupancy('sm_80', 64, 100 * 1024, 128)['limiter'], 'smem')
        self.assertEqual(sp.occupancy('sm_80', 64, 100 * 1024, 128)['blocks_per_sm'], 1)
        self.assertEqual(sp.occupancy('sm_80', 64, 164 * 1024, 128)['blocks_per_sm'], 0)  # over 163 KiB
        self.assertEqual(sp.occupancy('sm_90', 64, 164 * 1024, 256)['blocks_per_sm'], 1)

    def test_loop_without_plan(self):
        (r,) = rows(plan={})
        (lo,) = r['loops']
        self.assertEqual(lo['header'], '0x30')
        self.assertEqual(lo['nested_loops'], 1)
        s, m = lo['steady'], lo['masked']
        self.assertEqual((s['insn'], s['HMMA'], s['LDSM'], s['BAR'], s['MUFU'], s['int'], s['branch'], s['LDL'], s['STL']),
                         (15, 2, 1, 1, 1, 4, 3, 1, 1))
        self.assertEqual((s['insn_per_hmma'], s['ldsm_per_hmma'], s['ldst_local']), (7.5, 0.5, 2))
        self.assertEqual((m['insn'], m['int'], m['insn_per_hmma']), (18, 6, 9.0))

    def test_loop_with_copy_passes(self):
        (r,) = rows()
        s, m = r['loops'][0]['steady'], r['loops'][0]['masked']
        self.assertEqual((s['insn'], s['LDGSTS'], s['int'], s['branch'], s['copy_loop_passes']), (43, 8, 18, 10, 8))
        self.assertEqual((s['insn_per_hmma'], m['insn'], m['insn_per_hmma']), (21.5, 46, 23.0))

    def test_check(self):
        data = rows()
        ok = {'budgets': [{'family': 'fa_tc', 'kind': 'forward', 'W': 64, 'arch': 'sm_90', 'max_insn_per_hmma': 21.5,
                           'max_ldsm_per_hmma': 0.5, 'max_masked_insn_per_hmma': 23.0, 'max_loop_ldst_local': 2,
                           'max_stack_bytes': 16, 'min_blocks_per_sm': 3},
                          {'goal': True, 'family': 'fa_tc_wide', 'kind': 'forward', 'max_insn_per_hmma': 4.0}]}
        bad, goals = sp.check(data, ok)
        self.assertEqual(bad, [])
        self.assertEqual(len(goals), 1)
        self.assertIn('no such kernel yet', goals[0])
        tight = {'budgets': [dict(ok['budgets'][0], max_insn_per_hmma=21.4, max_loop_ldst_local=1, min_blocks_per_sm=4),
                             {'family': 'fa_tc', 'kind': 'backward_dq', 'max_insn_per_hmma': 9.0},
                             {'goal': True, 'family': 'fa_tc', 'kind': 'forward', 'max_insn_per_hmma': 4.0}]}
        bad, goals = sp.check(data, tight)
        self.assertEqual(len(bad), 4, bad)
        self.assertTrue(any('insn_per_hmma = 21.5, budget max_insn_per_hmma = 21.4' in b for b in bad))
        self.assertTrue(any('ldst_local = 2, budget max_loop_ldst_local = 1' in b for b in bad))
        self.assertTrue(any('blocks_per_sm = 3, budget min_blocks_per_sm = 4' in b for b in bad))
        self.assertTrue(any('matches no kernel' in b for b in bad))
        self.assertIn('max_insn_per_hmma = 4.0', goals[0])  # a missed goal is reported, not failed

    def test_main_exit_codes(self):
        with tempfile.TemporaryDirectory() as tmp:
            budgets = os.path.join(tmp, 'b.json')
            with open(budgets, 'w') as f:
                json.dump({'budgets': [{'kind': 'forward', 'max_insn_per_hmma': 7.0}]}, f)
            code, out, _ = run_main([SASS, RES, '--check', budgets])
            self.assertEqual(code, 1)
            self.assertIn('BUDGET: fa_tc::forward<fa_tc::mma_sync_layer<(fa_dtype)1>, 64> sm_90: loop 0 (0x30) steady '
                          'insn_per_hmma = 7.5, budget max_insn_per_hmma = 7.0', out)
            with open(budgets, 'w') as f:
                json.dump({'budgets': [{'kind': 'forward', 'max_insn_per_hmma': 7.5}]}, f)
            self.assertEqual(run_main([SASS, RES, '--check', budgets])[0], 0)
            code, out, _ = run_main([SASS, '--json'])
            self.assertEqual((code, json.loads(out)[0]['loops'][0]['steady']['insn']), (0, 15))
            self.assertEqual(run_main([SASS, '--filter', 'backward'])[0], 2)
            self.assertEqual(run_main([SASS, '--arch', 'sm_80'])[0], 2)

    def test_missing_tools_skip(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, 'libflashattn-cuda.so')
            with open(fake, 'wb') as f:
                f.write(b'\x7fELF' + bytes(60))
            saved = sp.find_tools
            sp.find_tools = lambda tools_dir: None
            try:
                code, _, err = run_main([fake, '--check', os.path.join(HERE, 'sass_budgets.json')])
                self.assertEqual(code, 77)
                self.assertIn('pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm', err)
                stamp = os.path.join(tmp, 'stamp')
                code, _, _ = run_main([fake, '--cache', tmp, '--warm', stamp])
                self.assertEqual(code, 0)
                self.assertTrue(os.path.exists(stamp))
            finally:
                sp.find_tools = saved

    def test_budgets_file(self):
        with open(os.path.join(HERE, 'sass_budgets.json')) as f:
            budgets = json.load(f)['budgets']
        known = set(sp.LOOP_BOUNDS) | set(sp.KERNEL_BOUNDS) | {'name', 'goal', 'family', 'kind', 'dtype', 'W', 'arch', 'pattern',
                                                               'loops'}
        for b in budgets:
            self.assertLessEqual(set(b), known, b)
            self.assertIn(b.get('loops', 'all'), ('all', 'fastest'), b)

    def test_fastest_loop_only(self):
        def loop(header, insn_per_hmma):
            trip = {'insn_per_hmma': insn_per_hmma, 'ldsm_per_hmma': 0.3, 'ldst_local': 0}
            return {'header': header, 'steady': trip, 'masked': trip}
        row = {'family': 'fa_tc_wide', 'kind': 'forward', 'dtype': 'f16', 'W': 128, 'arch': 'sm_90',
               'kernel': 'fa_tc_wide::forward<(fa_dtype)1, 128>', 'loops': [loop('0x10', 4.6), loop('0x20', 3.9)]}
        every = {'family': 'fa_tc_wide', 'max_insn_per_hmma': 4.0}
        bad, _ = sp.check([row], {'budgets': [every]})
        self.assertEqual(len(bad), 1, bad)
        self.assertIn('loop 0 (0x10) steady insn_per_hmma = 4.6', bad[0])
        bad, _ = sp.check([row], {'budgets': [dict(every, loops='fastest')]})  # the unmasked loop only
        self.assertEqual(bad, [])
        bad, _ = sp.check([row], {'budgets': [dict(every, loops='fastest', max_insn_per_hmma=3.8)]})
        self.assertEqual(len(bad), 1, bad)
        self.assertIn('loop 1 (0x20)', bad[0])
        bad, _ = sp.check([row], {'budgets': [dict(every, loops='slowest')]})
        self.assertEqual(len(bad), 1, bad)
        self.assertIn("loops = 'slowest'", bad[0])

    @unittest.skipUnless(PLAN_PROGRAM or len(sys.argv) > 1, 'no plan program given')
    def test_plan_program(self):
        plan = sp.read_plan(PLAN_PROGRAM)
        self.assertEqual(plan[('fa_tc.forward', 64)], PLAN[('fa_tc.forward', 64)])
        self.assertEqual(plan[('fa_tc.forward', 128)]['copies'], 16)
        self.assertEqual(plan[('fa_tc.backward', 128)], {'threads': 128, 'smem_dynamic': 49408, 'copies': 8})


if __name__ == '__main__':
    if len(sys.argv) > 1 and not sys.argv[1].startswith('-'):
        PLAN_PROGRAM = sys.argv.pop(1)
    unittest.main()
