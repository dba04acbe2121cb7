#!/usr/bin/env python3
"""Mutation check of the emulated GPU suite: a suite that passes whatever the kernels do proves
nothing, so each mutant below (one deliberate bug in a copy of src/) must make
tests/gpu/test_gpu_backends fail under the emulator, and the unmutated copy, built and run the
same way, must pass (so a failure is the mutant's, not the build's).

  generic_missing_key_tile_barrier  the __syncthreads before the generic forward overwrites the
                                    shared K/V tile: threads still reading the previous tile see
                                    the next one (found only because the emulator's schedules
                                    interleave threads at every barrier)
  tc_p_halves_swapped               the two probabilities packed into one mma.sync register for
                                    P V change places
  tc_wide_partial_tile_as_inner     the wide-tile forward counts the key tile that holds a row's
                                    last visible key among the tiles that need no mask
  tc_wide_shallow_wait              the wide-tile forward waits for all but the newest cp.async
                                    group (one too shallow) before the barrier that publishes V
  tc_wide_backward_diagonal_dropped the wide-tile backward's masked tiles drop the largest visible
                                    key-minus-query difference (the causal diagonal)

Exit status: 0 every mutant killed and the control passed; 1 a mutant survived or the control
failed; 2 the check itself could not run (a mutation no longer matches the source, a build
failed).

--self-check checks the check: it runs one mutant that changes only a comment, which must
survive (a check that reports every mutant as killed proves nothing either); exit 0 when it
survived and the control passed."""
import argparse
import concurrent.futures
import os
import shlex
import shutil
import subprocess
import sys

MUTANTS = [
    {
        "name": "generic_missing_key_tile_barrier",
        "file": "src/gpu/kernels/attention_generic.cuh",
        "find": "    __syncthreads(); /* the previous tile is no longer read */\n",
        "replace": "",
        "family": "generic",
        "test": "test_case_table_f32",
        "cases": "seq129_d72,causal_seq129_d32,window_left_d32",
    },
    {
        "name": "tc_p_halves_swapped",
        "file": "src/gpu/nvidia/tile_mma_sync.cuh",
        "find": "pack2<DT>(p.v[fa_tc_p_item(kstep, reg, 0)], p.v[fa_tc_p_item(kstep, reg, 1)])",
        "replace": "pack2<DT>(p.v[fa_tc_p_item(kstep, reg, 1)], p.v[fa_tc_p_item(kstep, reg, 0)])",
        "family": "tc",
        "test": "test_case_table_f16",
        "cases": "seq7_d40,seq129_d72",
    },
    {
        "name": "tc_wide_partial_tile_as_inner",
        "file": "src/gpu/nvidia/attention_tc_wide.cuh",
        "find": "inner_hi = first_row.hi / BC - 1;",
        "replace": "inner_hi = first_row.hi / BC;",
        "family": "tc-wide",
        "test": "test_case_table_f16",
        "cases": "causal_seq129_d32,seq1000_d16_causal,window_right_d32",
    },
    {
        "name": "tc_wide_shallow_wait",
        "file": "src/gpu/nvidia/attention_tc_wide.cuh",
        "find": "    fa_copy_wait_all();\n    __syncthreads(); /* V_j visible; every warp is done with K_j */\n",
        "replace": "    fa_copy_wait_pending<1>();\n    __syncthreads(); /* V_j visible; every warp is done with K_j */\n",
        "family": "tc-wide",
        "test": "test_case_table_f16",
        "cases": "seq129_d72,full_128x128_d32",
    },
    {
        "name": "tc_wide_backward_diagonal_dropped",
        "file": "src/gpu/nvidia/attention_tc_wide_backward.cuh",
        "find": "diff >= lim_lo && diff <= lim_hi",
        "replace": "diff >= lim_lo && diff < lim_hi",
        "family": "tc-wide",
        "test": "test_case_table_f16",
        "cases": "causal_seq129_d32,full_causal_128x256_d64",
    },
]


HARMLESS_MUTANT = {
    "name": "comment_only",
    "file": "src/gpu/kernels/attention_generic.cuh",
    "find": "/* the previous tile is no longer read */",
    "replace": "/* (a changed comment) */",
    "family": "generic",
    "test": "test_case_table_f32",
    "cases": "seq129_d72",
}


def die(message):
    print("mutation_check: " + message, file=sys.stderr)
    sys.exit(2)


def build_plugin(args, variant_dir, core_object):
    """The CUDA plugin from variant_dir/src, compiled for the emulator as tests/gpu/emu does."""
    plugin_dir = os.path.join(variant_dir, "plugin")
    os.makedirs(plugin_dir, exist_ok=True)
    command = shlex.split(args.cxx) + [
        "-std=c++17", "-O2", "-DNDEBUG", "-fPIC", "-shared", "-fvisibility=hidden", "-w",
        '-DFA_GPU_EMULATOR="emu_runtime.h"', "-DEMU_TARGET_CUDA",
        "-I" + os.path.join(variant_dir, "src"), "-I" + os.path.join(args.source_root, "include"),
        "-I" + args.emu_dir, os.path.join(args.emu_dir, "emu_plugin.cpp"), core_object,
        "-o", os.path.join(plugin_dir, "libflashattn-cuda.so"),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        die("building %s failed:\n%s\n%s" % (variant_dir, " ".join(command), done.stderr[-4000:]))
    return plugin_dir


def run_suite(args, plugin_dir, mutant):
    env = dict(os.environ)
    env.pop("FA_TEST_QUICK", None)
    env.update({
        "FLASHATTN_BACKEND": "",
        "FLASHATTN_PLUGIN_DIR": plugin_dir,
        "FLASHATTN_GPU_KERNELS": mutant["family"],
        "FLASHATTN_EMU_SCHEDULE": "random:1",
        "FLASHATTN_REQUIRE_GPU": "1",
        "FA_TEST_CASES": mutant["cases"],
    })
    done = subprocess.run([args.test_binary, "cuda", mutant["test"]], env=env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cxx", required=True, help="the C++ compiler command")
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--emu-dir", required=True)
    parser.add_argument("--test-binary", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--self-check", action="store_true", help="run only a harmless mutant, which must survive")
    args = parser.parse_args()
    mutants = [HARMLESS_MUTANT] if args.self_check else MUTANTS

    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    core_object = os.path.join(args.work_dir, "emu_core.o")
    command = shlex.split(args.cxx) + ["-std=c++17", "-O2", "-fPIC", "-w", "-c",
                                       os.path.join(args.emu_dir, "emu_core.cpp"), "-o", core_object]
    if subprocess.run(command).returncode != 0:
        die("building the emulator core failed: " + " ".join(command))

    variants = {"control": None}
    for mutant in mutants:
        variants[mutant["name"]] = mutant
    for name, mutant in variants.items():
        variant_dir = os.path.join(args.work_dir, name)
        shutil.copytree(os.path.join(args.source_root, "src"), os.path.join(variant_dir, "src"))
        if mutant is None:
            continue
        path = os.path.join(variant_dir, mutant["file"])
        with open(path) as f:
            text = f.read()
        if text.count(mutant["find"]) != 1:
            die("%s: the text to mutate occurs %d times in %s (expected once): update MUTANTS"
                % (name, text.count(mutant["find"]), mutant["file"]))
        with open(path, "w") as f:
            f.write(text.replace(mutant["find"], mutant["replace"]))

    jobs = max(1, min(len(variants), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        plugins = dict(zip(variants, pool.map(
            lambda name: build_plugin(args, os.path.join(args.work_dir, name), core_object), variants)))

    ok = True
    for mutant in mutants:
        status, output = run_suite(args, plugins["control"], mutant)
        if status != 0:
            ok = False
            print("FAIL control (unmutated source), %s family, %s:\n%s" % (mutant["family"], mutant["test"], output[-3000:]))
        else:
            print("ok   control passes: %s family, %s, cases %s" % (mutant["family"], mutant["test"], mutant["cases"]))
        status, output = run_suite(args, plugins[mutant["name"]], mutant)
        wrong_result = status != 0 and "ERROR: case " in output
        if args.self_check:
            if status != 0:
                ok = False
                print("FAIL harmless mutant %s was reported as killed (exit %d):\n%s" % (mutant["name"], status, output[-3000:]))
            else:
                print("ok   harmless mutant %s survives, as it must" % mutant["name"])
        elif not wrong_result:
            ok = False
            print("FAIL mutant %s survived (exit %d, no failed case):\n%s" % (mutant["name"], status, output[-3000:]))
        else:
            reason = next((line.strip() for line in output.splitlines() if line.startswith("ERROR: case ")), "")
            print("ok   mutant %s killed: %s" % (mutant["name"], reason))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
