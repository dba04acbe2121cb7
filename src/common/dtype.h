/* The element types of fa_dtype: which values are known, which only a KV cache may hold, and how
 * many bytes one element takes. The one home of these rules (validation, the CPU tiles and the GPU
 * kernels read them here). */
#ifndef FA_DTYPE_H
#define FA_DTYPE_H
#include <stddef.h>

#include "flashattn.h"
#include "hostdev.h"

/* 1 for FA_DTYPE_F32, FA_DTYPE_F16 and FA_DTYPE_BF16 (the types of every tensor); 0 for any other value. */
FA_HD int fa_dtype_known(fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 || dtype == FA_DTYPE_F16 || dtype == FA_DTYPE_BF16;
}

/* 1 for the quantised types only a KV cache's k and v may hold (int8, FP8). */
FA_HD int fa_dtype_quantised(fa_dtype dtype)
{
    return dtype == FA_DTYPE_I8 || dtype == FA_DTYPE_FP8_E4M3 || dtype == FA_DTYPE_FP8_E5M2;
}

/* 1 for the FP8 types (a descale per sequence and kv head). */
FA_HD int fa_dtype_fp8(fa_dtype dtype) { return dtype == FA_DTYPE_FP8_E4M3 || dtype == FA_DTYPE_FP8_E5M2; }

/* Bytes per element of a known or quantised dtype. */
FA_HD size_t fa_dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : fa_dtype_quantised(dtype) ? 1 : 2; }
#endif
