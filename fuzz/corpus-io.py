#!/usr/bin/env python3
"""Writes the seed inputs of fuzz_io (fuzz/corpus/fuzz_io/), one per feature, in the input layout
of fuzz/README.md ("fuzz_io"). Run from the source root: python3 fuzz/corpus-io.py"""
import os

TILES, MASK, DENSITY, DROPOUT, BIAS, SCALE, CORRUPT = 1, 2, 4, 8, 16, 32, 64
STANDARD, FLASH, BLOCK_SPARSE, QUERY_OUTER = 0, 1, 2, 3
SEED = bytes([0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF0])


def seed(flags, algorithm, pairs, nq, nk, d, m_units, m_extra, tiles=None, mask=None, density=None,
         dropout=None, scale=None, amplitude=3, bias=None, corrupt=None):
    """Sizes are stored minus one (the target adds 1); M = 4 d (1 + m_units) + m_extra."""
    b = bytes([flags, algorithm, pairs - 1, nq - 1, nk - 1, d - 1, m_units, m_extra])
    if tiles: b += bytes([tiles[0] - 1, tiles[1] - 1])
    if mask: b += bytes([mask[0] - 1, mask[1] - 1, mask[2]]) + SEED
    if density is not None: b += bytes([density])
    if dropout is not None: b += bytes([dropout]) + SEED + bytes([5])
    if scale is not None: b += bytes([scale])
    b += bytes([amplitude]) + SEED
    if bias is not None: b += bytes([bias])
    if corrupt is not None: b += bytes([corrupt])
    return b


SEEDS = {
    "standard": seed(0, STANDARD, 2, 17, 23, 8, 3, 0),
    "flash-paper-tiles": seed(0, FLASH, 1, 33, 40, 16, 5, 7),
    "flash-explicit-tiles-dropout": seed(TILES | DROPOUT, FLASH, 2, 20, 13, 5, 2, 0, tiles=(3, 7), dropout=3),
    "block-sparse-mask": seed(MASK, BLOCK_SPARSE, 1, 40, 37, 6, 4, 1, mask=(5, 3, 128)),
    "block-sparse-density": seed(DENSITY, BLOCK_SPARSE, 3, 32, 32, 4, 1, 0, density=7),
    "query-outer-mask-bias": seed(MASK | BIAS, QUERY_OUTER, 2, 9, 30, 12, 6, 3, mask=(2, 7, 200), bias=1),
    "flash-bias-shared-scale": seed(BIAS | SCALE, FLASH, 3, 11, 19, 3, 8, 2, scale=20, bias=2),
    "corrupt-tiles": seed(CORRUPT, FLASH, 1, 8, 8, 4, 1, 0, corrupt=3),
    "corrupt-bias-stride": seed(BIAS | CORRUPT, FLASH, 2, 8, 8, 4, 1, 0, bias=0, corrupt=7),
}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_io")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
