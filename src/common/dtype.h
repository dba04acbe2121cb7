/* The element types of fa_dtype: which values are known, and how many bytes one element takes.
 * The one home of both rules (validation, the CPU tiles and the GPU kernels read them here). */
#ifndef FA_DTYPE_H
#define FA_DTYPE_H
#include <stddef.h>

#include "flashattn.h"
#include "hostdev.h"

/* 1 for FA_DTYPE_F32, FA_DTYPE_F16 and FA_DTYPE_BF16; 0 for any other value. */
FA_HD int fa_dtype_known(fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 || dtype == FA_DTYPE_F16 || dtype == FA_DTYPE_BF16;
}

/* Bytes per element of a known dtype. */
FA_HD size_t fa_dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }
#endif
