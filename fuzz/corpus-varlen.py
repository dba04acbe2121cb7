#!/usr/bin/env python3
"""Writes the hand-written fuzz_varlen seeds into fuzz/corpus/fuzz_varlen/, one per feature (input
layout: fuzz/README.md, "fuzz_varlen"). Run from the repository root."""
import os

CORPUS = "fuzz/corpus/fuzz_varlen"
CAUSAL, WINDOW, DROPOUT, BLOCK_MASK, MODIFIERS, LIE, SCALE, CORRUPT = 1, 2, 4, 8, 16, 32, 64, 128
F32, F16, BF16 = 0, 1, 2
SOFTCAP, ALIBI, ALIBI_PER_SEQ, SINKS, BIAS = 1, 2, 4, 8, 16
(C_FIRST, C_DECREASING, C_LAST, C_NEGATIVE, C_BATCH, C_MAX, C_OUT_SHAPE, C_TENSOR_BATCH, C_SEQLENS_K,
 C_NULL_OFFSETS, C_BLOCK_MASK, C_POSITIONS) = range(12)


def corruption(mode, k=0, variant=0, seq=0):
    return mode + 12 * k + 24 * variant + 48 * seq


def seed(flags=0, corrupt=0, alloc=0, dtype=F32, lens=((3, 4),), heads_kv=1, group=1, d=8, lie=None,
         window=None, dropout=None, mask=None, scale=None, amplitude=3, value_seed=1, modifiers=None):
    """lens: (queries, keys) per sequence, each 0..12; the rest as the layout's optional fields."""
    out = [flags, corrupt, alloc, dtype, len(lens) - 1, heads_kv - 1, group - 1, d - 1]
    for q, k in lens:
        out += [q, k]
    if flags & LIE:
        out.append(lie)
    if flags & WINDOW:
        out += list(window)
    if flags & DROPOUT:
        p, s, o = dropout
        out += [p] + list(s.to_bytes(8, "big")) + list(o.to_bytes(8, "big"))
    if flags & BLOCK_MASK:
        out += list(mask)
    if flags & SCALE:
        out.append(scale)
    out += [amplitude] + list(value_seed.to_bytes(8, "big"))
    if flags & MODIFIERS:
        out += list(modifiers)
    return bytes(out)


SEEDS = {
    "empty-sequences-f32": seed(lens=((3, 4), (0, 0), (0, 5), (2, 0), (6, 6))),
    "gqa-causal-f32": seed(CAUSAL, lens=((5, 3), (2, 7), (4, 4)), heads_kv=2, group=3, d=16),
    "window-bf16": seed(WINDOW | CAUSAL, dtype=BF16, lens=((6, 9), (8, 5)), heads_kv=1, group=2,
                        window=(3, 1)),
    "dropout-causal-f16": seed(DROPOUT | CAUSAL, dtype=F16, lens=((7, 4), (0, 3), (5, 10)), heads_kv=2, group=2,
                               dropout=(64, 0x1234, 5)),
    "block-mask-lie-larger-f32": seed(BLOCK_MASK | LIE, lens=((9, 6), (3, 11)), lie=2 | 3 << 3,
                                      mask=[3, 4, 160] + [0x5a, 0x10, 0xf0, 0x80, 0x33, 0xc4] * 2),
    "lie-smaller-k": seed(LIE, lens=((4, 9), (2, 3)), lie=3 | 4 | 1 << 3),
    "modifiers-alibi-sinks-bias-f32": seed(MODIFIERS | CAUSAL | SCALE, lens=((4, 6), (0, 2), (5, 3)), heads_kv=1,
                                           group=2, scale=150,
                                           modifiers=[SOFTCAP | ALIBI | ALIBI_PER_SEQ | SINKS | BIAS, 20,
                                                      8, 16, 24, 32, 40, 48, 20, 255, F32, 0, 4]),
    "modifiers-dropout-shared-bias-bf16": seed(MODIFIERS | DROPOUT | LIE, dtype=BF16, lens=((5, 5), (3, 8)),
                                               heads_kv=2, lie=0 | 2 << 3, dropout=(100, 7, 0),
                                               modifiers=[SINKS | BIAS, 10, 30, F16, 1 | 4, 8]),
    "alloc-fault-3": seed(CAUSAL, alloc=3, lens=((4, 4), (0, 2), (3, 5))),
    "corrupt-first-offset-k": seed(CORRUPT, corruption(C_FIRST, k=1), lens=((3, 4), (2, 2))),
    "corrupt-decreasing-q": seed(CORRUPT, corruption(C_DECREASING, seq=1), lens=((3, 4), (2, 2), (1, 1))),
    "corrupt-last-past-total-k": seed(CORRUPT, corruption(C_LAST, k=1), lens=((3, 4), (2, 2))),
    "corrupt-batch-mismatch": seed(CORRUPT | MODIFIERS, corruption(C_BATCH), lens=((3, 4), (2, 2)),
                                   modifiers=[SINKS, 3]),
    "corrupt-out-shape": seed(CORRUPT, corruption(C_OUT_SHAPE, variant=1), lens=((3, 4), (0, 2))),
    "corrupt-positions-not-supported": seed(CORRUPT, corruption(C_POSITIONS, k=1), lens=((3, 4), (2, 2))),
}

os.makedirs(CORPUS, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(CORPUS, name), "wb") as f:
        f.write(data)
