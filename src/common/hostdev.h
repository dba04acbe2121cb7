/* Lets the small shared helpers (visibility, Philox, tiling) compile as C, CUDA and HIP. */
#ifndef FA_HOSTDEV_H
#define FA_HOSTDEV_H
#if defined(__CUDACC__) || defined(__HIPCC__)
#  define FA_HD __host__ __device__ __forceinline__
#else
#  define FA_HD static inline
#endif
#endif
