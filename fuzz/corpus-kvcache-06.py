#!/usr/bin/env python3
"""Writes the fuzz_kvcache seeds of the 0.6 choices (quantised caches, rotary, fa_kvcache_append) into
fuzz/corpus/fuzz_kvcache/: each is an older seed with the extension bytes appended (fuzz/README.md,
"then (0.6)"), and for one the corruption flag set. Run from the repository root."""
import os

CORPUS = "fuzz/corpus/fuzz_kvcache"
I8, E4M3, E5M2 = 1, 2, 3
ROTARY, APPEND, BAD_SCALES, DESCALES = 16, 32, 64, 128

def ext(k=0, v=0, flags=0):
    return k | v << 2 | flags

SEEDS = {
    # name: (base seed, byte 0 OR-mask, byte 1 or None, extension bytes)
    "quant-i8-padded-causal-gqa": ("padded-causal-gqa-f32", 0, None, [ext(I8, I8)]),
    "quant-e4m3-e5m2-descales-paged-ragged": ("paged-ragged-bf16", 0, None, [ext(E4M3, E5M2, DESCALES), 3]),
    "quant-i8-k-e4m3-v-modifiers-rotary": ("modifiers-window-alibi-sinks", 0, None, [ext(I8, E4M3, ROTARY), 0x18, 1, 3]),
    "rotary-i8-slots-leftpad": ("slots-leftpad-f32", 0, None, [ext(I8, 0, ROTARY), 0x10, 1, 2]),
    "rotary-neox-split-long": ("split-37-long-f16", 0, None, [ext(0, 0, ROTARY), 0x20, 0, 5]),
    "append-e5m2-rotary-ragged-cu-k": ("ragged-cu-seqlens-k-f16", 0, None, [ext(E5M2, E5M2, ROTARY | APPEND), 0x08, 0, 0]),
    "append-i8-paged": ("default-split-paged-page1", 0, None, [ext(I8, I8, APPEND)]),
    "append-f32-slots": ("slots-leftpad-f32", 0, None, [ext(0, 0, APPEND)]),
    "bad-i8-scale-missing": ("padded-causal-gqa-f32", 0, None, [ext(I8, 0, BAD_SCALES), 0]),
    "bad-descale-nan": ("paged-ragged-bf16", 0, None, [ext(E4M3, 0, DESCALES | BAD_SCALES), 4, 2]),
    "bad-scale-wrong-dtype": ("ragged-q-offsets-f32", 0, None, [ext(0, E5M2, BAD_SCALES), 1]),
    "bad-rotary-max-position": ("padded-causal-gqa-f32", 0, None, [ext(0, 0, ROTARY), 0, 0, 0x81]),
    "bad-rotary-odd-dim": ("ragged-q-offsets-f32", 0, None, [ext(I8, I8, ROTARY), 7, 0, 0]),
    "bad-append-cu-seqlens-q": ("ragged-cu-seqlens-k-f16", 128, 0, [ext(E4M3, I8, APPEND)]),
}

for name, (base, or_mask, byte1, tail) in SEEDS.items():
    data = bytearray(open(os.path.join(CORPUS, base), "rb").read())
    data[0] |= or_mask
    if byte1 is not None:
        data[1] = byte1
    open(os.path.join(CORPUS, name), "wb").write(bytes(data) + bytes(tail))
