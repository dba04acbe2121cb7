#!/usr/bin/env python3
"""Writes tile-budget variants of seeds of fuzz_attention and fuzz_varlen into their corpora: the
seed zero-padded to the length its problem decodes from (a missing byte reads as 0, so the problem
is unchanged), then the CPU tile-budget byte (fuzz/README.md), so that its short sequences cross
query and key tile boundaries. Run from the repository root after building the targets
(scripts/ci-fuzz.sh or meson's fuzz/*_replay):
  fuzz/corpus-tiles.py build-fuzz/fuzz_attention build-fuzz/fuzz_varlen"""
import os
import re
import subprocess
import sys

# Seed -> tile bytes (256 b bytes: 1 gives key tiles of one kernel step).
VARIANTS = {
    "fuzz_attention": {"dense-f32": (1, 6), "causal-gqa-f32": (1,), "window-f16": (2,), "padding-bf16": (1,),
                       "dropout-f32": (3,), "block-mask-f32": (1,), "modifiers-all-padding-f16": (2,),
                       "positions-causal-dropout-f32": (1,), "strided-f16": (1,), "large-head-dim": (8,)},
    "fuzz_varlen": None,  # every seed, tile byte 1
}


def decoded_length(binary, path):
    env = dict(os.environ, FUZZ_VERBOSE="1", FA_FUZZ_BACKEND="cpu")
    log = subprocess.run([binary, path], env=env, capture_output=True, text=True).stderr
    return int(re.search(r"input: \d+ bytes, (\d+) decoded", log).group(1))


def main():
    for binary in sys.argv[1:]:
        target = re.sub(r"_replay$", "", os.path.basename(binary))
        corpus = f"fuzz/corpus/{target}"
        variants = VARIANTS[target]
        if variants is None:
            variants = {name: (1,) for name in sorted(os.listdir(corpus)) if "-tiles-" not in name}
        for name, tile_bytes in variants.items():
            data = open(os.path.join(corpus, name), "rb").read()
            # The tile byte is the last one decoded: everything before it keeps its meaning.
            length = decoded_length(binary, os.path.join(corpus, name)) - 1
            prefix = data[:length].ljust(length, b"\0")
            for b in tile_bytes:
                with open(os.path.join(corpus, f"{name}-tiles-{b}"), "wb") as f:
                    f.write(prefix + bytes([b]))


if __name__ == "__main__":
    main()
