/* Runtime dispatch over the few instantiated generic kernels: (head-dim bucket, tile) pairs from
 * fa_gpu_tile_options() in plan.h, five kernels each (forward, the backward's two, its dbias
 * pass, the KV-cache attention), plus the untemplated delta pre-pass, dsinks, checks, append and
 * merge. */
#ifndef FA_GPU_GENERIC_DISPATCH_CUH
#define FA_GPU_GENERIC_DISPATCH_CUH
#include "attention_decode.cuh"
#include "modifier_gradients.cuh"

typedef void (*fa_gpu_kernel)(fa_gpu_params);

typedef struct fa_generic_set {
    fa_gpu_kernel forward, backward_dq, backward_dkdv, backward_dbias, decode;
} fa_generic_set;

template <int BUCKET, int TILE>
static fa_generic_set fa_generic_instance(void)
{
    fa_generic_set set;
    set.forward = fa_generic::forward<BUCKET, TILE>;
    set.backward_dq = fa_generic::backward_dq<BUCKET, TILE>;
    set.backward_dkdv = fa_generic::backward_dkdv<BUCKET, TILE>;
    set.backward_dbias = fa_generic::backward_dbias<TILE>;
    set.decode = fa_decode::attend<BUCKET, TILE>;
    return set;
}

/* The kernels of (bucket, tile); all NULL for a pair that is not instantiated. */
static fa_generic_set fa_generic_kernels(int bucket, int tile)
{
    switch (bucket * 1000 + tile) {
    case 64064: return fa_generic_instance<64, 64>();
    case 64032: return fa_generic_instance<64, 32>();
    case 64016: return fa_generic_instance<64, 16>();
    case 128064: return fa_generic_instance<128, 64>();
    case 128032: return fa_generic_instance<128, 32>();
    case 128016: return fa_generic_instance<128, 16>();
    case 256032: return fa_generic_instance<256, 32>();
    case 256016: return fa_generic_instance<256, 16>();
    case 256008: return fa_generic_instance<256, 8>();
    }
    fa_generic_set none = {NULL, NULL, NULL, NULL, NULL};
    return none;
}
#endif
