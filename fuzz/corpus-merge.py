#!/usr/bin/env python3
"""Writes the hand-written seeds of fuzz_merge and fuzz_dropout_mask into fuzz/corpus/fuzz_merge/ and
fuzz/corpus/fuzz_dropout_mask/ (byte layouts: fuzz/README.md). Run from the repository root."""
import os
import struct

# ---- fuzz_merge -----------------------------------------------------------------------------------
STRIDED, NO_LSE_OUT, SPECIAL_LSE, SPECIAL_VALUES, SHARED, ALLOC_FAULT, CORRUPT = 1, 2, 4, 8, 16, 32, 128
F32, F16, BF16 = 0, 1, 2
NAN, POS_INF, HUGE, EXP_EDGE, FLT_MAX, TINY = 1, 2, 4, 8, 16, 32
(C_N, C_OUTS_NULL, C_LSES_NULL, C_PART_NULL, C_LSE_NULL, C_PART_SHAPE, C_PART_DTYPE, C_OUT_OVER_PART,
 C_OUT_OVER_LSE, C_LSE_OUT_OVER_LSE, C_LSE_OUT_OVER_OUT, C_LSE_OUT_OVER_PART, C_STRIDES, C_OUT_DIMS,
 C_MISALIGNED, C_NULL_OTHER) = range(16)


def merge(flags=0, n=2, dtype=F32, batch=1, seqlen=4, heads=2, head_dim=8, amplitude=1.0, spread=3.0, center=0.0,
          seed=1, layouts=(), lse=(0, 0, 0, 0), values=0, fault=0, corruption=0, variant=0):
    """One input: the sizes as the target reads them back (n 1..8, batch 1..3, ...)."""
    data = bytes([flags, corruption, n - 1, dtype, batch - 1, seqlen - 1, heads - 1, head_dim - 1,
                  int(amplitude / 0.25) - 1, int(spread / 0.5), int(center / 0.5) & 255])
    data += struct.pack(">Q", seed)
    if flags & STRIDED:
        assert len(layouts) == n + 1
        data += bytes(layouts)
    if flags & SPECIAL_LSE:
        data += bytes(lse)
    if flags & SPECIAL_VALUES:
        data += bytes([values])
    if flags & ALLOC_FAULT:
        data += bytes([fault - 1])
    if flags & CORRUPT:
        data += bytes([variant])
    return data


def part_variant(part, detail):
    return detail * 8 + part


MERGE = {
    "two-parts-f32": merge(),
    "eight-parts-strided-bf16": merge(STRIDED, n=8, dtype=BF16, batch=2, seqlen=7, heads=3, head_dim=33, spread=10.0,
                                      layouts=(0x05, 0x41, 0x80, 0x3f, 0x7f, 0x12, 0x64, 0x00, 0x2a), seed=7),
    "neginf-rows-unread-nan-f16": merge(SPECIAL_LSE | SPECIAL_VALUES, n=3, dtype=F16, seqlen=9, heads=2,
                                        head_dim=17, lse=(90, 40, 0, 0), values=40, seed=3),
    "nan-inf-lse-poison": merge(SPECIAL_LSE, n=4, seqlen=12, heads=1, head_dim=5, lse=(30, 10, 70, NAN | POS_INF),
                                seed=11),
    "huge-lse-exp-edges-strided": merge(STRIDED | SPECIAL_LSE, n=5, dtype=BF16, batch=2, seqlen=6, heads=2,
                                        head_dim=12, layouts=(0x15, 0x80, 0x42, 0x03, 0x70, 0x2c),
                                        lse=(25, 5, 140, HUGE | EXP_EDGE | FLT_MAX | TINY), seed=5),
    "wide-spread-nonfinite-values": merge(SPECIAL_VALUES, n=6, dtype=F32, seqlen=10, heads=3, head_dim=24,
                                          amplitude=4.0, spread=31.5, center=-20.0, values=60, seed=13),
    "shared-inputs-no-lse-out": merge(SHARED | NO_LSE_OUT | STRIDED, n=5, dtype=F16, seqlen=5, heads=4, head_dim=9,
                                      layouts=(0x01, 0x44, 0x80, 0x10, 0x08, 0x61), seed=17),
    "alloc-fault-weights": merge(ALLOC_FAULT, n=3, seqlen=3, head_dim=6, fault=2, seed=19),
    "large-shape-f16": merge(0, n=2, dtype=F16, batch=3, seqlen=40, heads=4, head_dim=70, spread=2.0, seed=23),
    "corrupt-n-negative": merge(CORRUPT, n=3, corruption=C_N, variant=part_variant(0, 1)),
    "corrupt-out-overlaps-part": merge(CORRUPT | STRIDED, n=3, dtype=BF16, layouts=(0x05, 0x41, 0x00, 0x15),
                                       corruption=C_OUT_OVER_PART, variant=part_variant(1, 3)),
    "corrupt-lse-out-overlaps-lse": merge(CORRUPT | NO_LSE_OUT, n=2, corruption=C_LSE_OUT_OVER_LSE,
                                          variant=part_variant(1, 2)),
}

# ---- fuzz_dropout_mask ----------------------------------------------------------------------------
HUGE_INDICES, SPECIAL_P = 1, 2
D_KEEP_NULL, D_P, D_HEADS, D_SEQLEN_Q, D_SEQLEN_K, D_BATCH, D_HEAD, D_OVERFLOW = range(8)


def dropout(flags=0, corruption=0, seed=0x1234, offset=0, p=128, heads=2, seqlen_q=8, seqlen_k=8, batch=0, head=0,
            huge=()):
    data = bytes([flags, corruption]) + struct.pack(">QQ", seed, offset)
    data += bytes([p, heads - 1, seqlen_q - 1, seqlen_k - 1, batch, head])
    if flags & HUGE_INDICES:
        data += bytes(huge)
    return data


DROPOUT = {
    "half-8x8": dropout(),
    "odd-sizes-unaligned-groups": dropout(seed=0xdeadbeef, offset=5, p=64, heads=3, seqlen_q=7, seqlen_k=13, batch=5,
                                          head=2),
    "large-64x64-high-p": dropout(seed=2**63 + 1, offset=2**40, p=250, heads=16, seqlen_q=64, seqlen_k=64, batch=255,
                                  head=15),
    "p-zero-keeps-all": dropout(flags=SPECIAL_P, p=0, seqlen_q=5, seqlen_k=3),
    "p-one-minus-ulp": dropout(flags=SPECIAL_P, p=11, seqlen_q=33, seqlen_k=31, heads=4, head=3, batch=9),
    "indices-at-int64-max": dropout(flags=HUGE_INDICES, seqlen_q=7, seqlen_k=7, huge=(47, 0x85, 0)),
    "indices-near-limit-one-head": dropout(flags=HUGE_INDICES | SPECIAL_P, p=8, seqlen_q=3, seqlen_k=5,
                                           huge=(0, 0, 3)),
    "invalid-p-nan": dropout(flags=128, corruption=D_P + 8 * 5),
    "invalid-head-index": dropout(flags=128, corruption=D_HEAD + 8 * 1, heads=3),
    "overflow-batch-index": dropout(flags=128 | HUGE_INDICES, corruption=D_OVERFLOW, seqlen_q=9, seqlen_k=2,
                                    huge=(30, 0x80, 0)),
    "keep-null": dropout(flags=128, corruption=D_KEEP_NULL),
}

for target, seeds in (("fuzz_merge", MERGE), ("fuzz_dropout_mask", DROPOUT)):
    corpus = os.path.join("fuzz", "corpus", target)
    os.makedirs(corpus, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
