// Standard attention on the GPU (the paper's Algorithm 0 as frameworks run it: cuBLAS
// S = QK^T, a softmax kernel, cuBLAS PV, and the matching backward) against flashattn's CUDA
// backend, same inputs, same GPU: time per call, TFLOP/s, speedup and device memory.
// FLOPs: 4 N^2 d heads batch forward, 2.5x that backward, halved when causal.
// Usage: fa-bench-standard-attention [--dtype f16|bf16] [--d 64] [--n 4096] [--batch B]
//        [--heads 16] [--causal] [--iters 10]   (batch defaults to 16384 / n)
// Status: written for a GPU session; never run on hardware yet.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flashattn.h"

#define CHECK_CUDA(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CHECK_BLAS(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s: cuBLAS status %d\n", #x, (int)s_); exit(1); } } while (0)
#define CHECK_FA(x) do { fa_status s_ = (x); if (s_ != FA_SUCCESS) { fprintf(stderr, "%s: %s\n", #x, fa_last_error()); exit(1); } } while (0)

struct options { fa_dtype dtype = FA_DTYPE_F16; int d = 64, n = 4096, batch = 0, heads = 16, causal = 0, iters = 10; };

static options parse(int argc, char **argv)
{
    options o;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--dtype")) { o.dtype = !strcmp(next, "bf16") ? FA_DTYPE_BF16 : FA_DTYPE_F16; ++i; }
        else if (!strcmp(a, "--d")) { o.d = atoi(next); ++i; }
        else if (!strcmp(a, "--n")) { o.n = atoi(next); ++i; }
        else if (!strcmp(a, "--batch")) { o.batch = atoi(next); ++i; }
        else if (!strcmp(a, "--heads")) { o.heads = atoi(next); ++i; }
        else if (!strcmp(a, "--iters")) { o.iters = atoi(next); ++i; }
        else if (!strcmp(a, "--causal")) o.causal = 1;
        else { fprintf(stderr, "unknown argument %s\n", a); exit(2); }
    }
    if (o.batch <= 0) o.batch = std::max(1, 16384 / o.n);
    return o;
}

template <typename T> __device__ float to_f(T x);
template <> __device__ float to_f(__half x) { return __half2float(x); }
template <> __device__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ T from_f(float x);
template <> __device__ __half from_f(float x) { return __float2half_rn(x); }
template <> __device__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }

__device__ float block_reduce(float v, bool is_max, float *shared)
{
    for (int o = 16; o > 0; o /= 2) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    v = shared[0];
    for (int w = 1; w < (int)blockDim.x / 32; ++w) v = is_max ? fmaxf(v, shared[w]) : v + shared[w];
    __syncthreads();
    return v;
}

// P = softmax(scale * S) row by row, causal (query i sees keys j <= i) when asked; one block per row.
template <typename T>
__global__ void softmax_rows(T *s, int n, float scale, int causal)
{
    __shared__ float shared[32];
    T *row = s + (size_t)blockIdx.x * n;
    const int i = blockIdx.x % n;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (!causal || j <= i) mx = fmaxf(mx, to_f(row[j]) * scale);
    mx = block_reduce(mx, true, shared);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (!causal || j <= i) sum += expf(to_f(row[j]) * scale - mx);
    sum = block_reduce(sum, false, shared);
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        row[j] = from_f<T>((!causal || j <= i) ? expf(to_f(row[j]) * scale - mx) / sum : 0.0f);
}

// dS = P o (dP - rowsum(P o dP)), written over dP; one block per row.
template <typename T>
__global__ void softmax_backward_rows(const T *p, T *dp, int n)
{
    __shared__ float shared[32];
    const T *prow = p + (size_t)blockIdx.x * n;
    T *drow = dp + (size_t)blockIdx.x * n;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) dot += to_f(prow[j]) * to_f(drow[j]);
    dot = block_reduce(dot, false, shared);
    for (int j = threadIdx.x; j < n; j += blockDim.x) drow[j] = from_f<T>(to_f(prow[j]) * (to_f(drow[j]) - dot));
}

__global__ void fill_random(uint16_t *x, size_t count, uint32_t seed, int bf16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        const float v = ((float)(h & 0xffff) / 65535.0f - 0.5f) * 2.0f;
        x[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
    }
}

// Column-major views of row-major [rows, d] matrices; one (batch, head) per batch entry.
struct gemm_ctx { cublasHandle_t h; cudaDataType_t type; int batches; };

static void gemm(const gemm_ctx &g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *a,
                 int lda, long long sa, const void *b, int ldb, long long sb, void *c, int ldc, long long sc, float alpha)
{
    const float beta = 0.0f;
    CHECK_BLAS(cublasGemmStridedBatchedEx(g.h, ta, tb, m, n, k, &alpha, a, g.type, lda, sa, b, g.type, ldb, sb, &beta, c,
                                          g.type, ldc, sc, g.batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct standard_buffers { void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *s, *dp; };

template <typename T>
static void standard_forward(const gemm_ctx &g, const options &o, const standard_buffers &x)
{
    const int n = o.n, d = o.d;
    const long long sq = (long long)n * d, ss = (long long)n * n;
    gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, x.k, d, sq, x.q, d, sq, x.s, n, ss, 1.0f);  // S^T = K Q^T
    softmax_rows<T><<<g.batches * n, 256>>>((T *)x.s, n, 1.0f / sqrtf((float)d), o.causal);
    gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, d, n, n, x.v, d, sq, x.s, n, ss, x.o, d, sq, 1.0f);  // O^T = V^T P^T
}

template <typename T>
static void standard_backward(const gemm_ctx &g, const options &o, const standard_buffers &x)
{
    const int n = o.n, d = o.d;
    const long long sq = (long long)n * d, ss = (long long)n * n;
    const float scale = 1.0f / sqrtf((float)d);
    gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, d, n, n, x.dout, d, sq, x.s, n, ss, x.dv, d, sq, 1.0f);  // dV = P^T dO
    gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, n, n, d, x.v, d, sq, x.dout, d, sq, x.dp, n, ss, 1.0f); // dP = dO V^T
    softmax_backward_rows<T><<<g.batches * n, 256>>>((const T *)x.s, (T *)x.dp, n);
    gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, d, n, n, x.k, d, sq, x.dp, n, ss, x.dq, d, sq, scale);  // dQ = dS K
    gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, d, n, n, x.q, d, sq, x.dp, n, ss, x.dk, d, sq, scale);  // dK = dS^T Q
}

template <typename F> static double time_ms(int iters, F fn)
{
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    fn(); // warm-up
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
        CHECK_CUDA(cudaEventRecord(a));
        fn();
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float t;
        CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

static size_t used_bytes(void)
{
    size_t free_b, total;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
    return total - free_b;
}

int main(int argc, char **argv)
{
    const options o = parse(argc, argv);
    const size_t qkv = (size_t)o.batch * o.heads * o.n * o.d, scores = (size_t)o.batch * o.heads * o.n * o.n;
    const size_t elem = 2;
    const double flops_fwd = 4.0 * o.n * (double)o.n * o.d * o.heads * o.batch * (o.causal ? 0.5 : 1.0);
    const double flops_fb = flops_fwd * 3.5;
    printf("# dtype=%s d=%d n=%d batch=%d heads=%d causal=%d\n", o.dtype == FA_DTYPE_BF16 ? "bf16" : "f16", o.d, o.n,
           o.batch, o.heads, o.causal);

    CHECK_CUDA(cudaFree(0));
    const size_t base = used_bytes();
    standard_buffers x;
    void **inputs[] = {&x.q, &x.k, &x.v, &x.dout};
    for (void **p : inputs) {
        CHECK_CUDA(cudaMalloc(p, qkv * elem));
        fill_random<<<1024, 256>>>((uint16_t *)*p, qkv, (uint32_t)(p - inputs[0]) * 977u + 1u, o.dtype == FA_DTYPE_BF16);
    }
    void **outputs[] = {&x.o, &x.dq, &x.dk, &x.dv};
    for (void **p : outputs) CHECK_CUDA(cudaMalloc(p, qkv * elem));
    const size_t io_bytes = used_bytes() - base;

    // flashattn first (its workspace is the only memory it adds), then the standard path.
    fa_context *ctx;
    CHECK_FA(fa_context_create(FA_BACKEND_CUDA, 0, &ctx));
    printf("# %s\n", fa_context_info(ctx));
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = o.causal;
    const long long sb = (long long)o.heads * o.n * o.d, ss = o.d, sh = (long long)o.n * o.d; // [B, H, N, d]
    auto tensor = [&](void *data) { return fa_tensor{data, o.dtype, o.batch, o.n, o.heads, o.d, sb, ss, sh}; };
    fa_tensor tq = tensor(x.q), tk = tensor(x.k), tv = tensor(x.v), to = tensor(x.o), tdo = tensor(x.dout);
    fa_tensor tdq = tensor(x.dq), tdk = tensor(x.dk), tdv = tensor(x.dv);
    float *lse;
    CHECK_CUDA(cudaMalloc(&lse, (size_t)o.batch * o.heads * o.n * sizeof(float)));
    const double fa_fwd = time_ms(o.iters, [&] { CHECK_FA(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, lse)); });
    const double fa_fb = time_ms(o.iters, [&] {
        CHECK_FA(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, lse));
        CHECK_FA(fa_backward(ctx, &desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv));
    });
    const size_t fa_extra = used_bytes() - base - io_bytes;
    fa_context_destroy(ctx);
    CHECK_CUDA(cudaFree(lse));

    const size_t before_std = used_bytes();
    CHECK_CUDA(cudaMalloc(&x.s, scores * elem));
    CHECK_CUDA(cudaMalloc(&x.dp, scores * elem));
    const size_t std_extra = used_bytes() - before_std;
    gemm_ctx g;
    CHECK_BLAS(cublasCreate(&g.h));
    g.type = o.dtype == FA_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    g.batches = o.batch * o.heads;
    const bool bf = o.dtype == FA_DTYPE_BF16;
    auto fwd = [&] { if (bf) standard_forward<__nv_bfloat16>(g, o, x); else standard_forward<__half>(g, o, x); };
    auto bwd = [&] { if (bf) standard_backward<__nv_bfloat16>(g, o, x); else standard_backward<__half>(g, o, x); };
    const double std_fwd = time_ms(o.iters, fwd);
    const double std_fb = time_ms(o.iters, [&] { fwd(); bwd(); });
    CHECK_CUDA(cudaGetLastError());

    printf("%-10s %10s %10s %12s %12s %14s\n", "method", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s", "f+b TFLOP/s", "extra memory");
    printf("%-10s %10.3f %10.3f %12.2f %12.2f %11.1f MiB\n", "standard", std_fwd, std_fb, flops_fwd / std_fwd / 1e9,
           flops_fb / std_fb / 1e9, std_extra / 1048576.0);
    printf("%-10s %10.3f %10.3f %12.2f %12.2f %11.1f MiB\n", "flashattn", fa_fwd, fa_fb, flops_fwd / fa_fwd / 1e9,
           flops_fb / fa_fb / 1e9, fa_extra / 1048576.0);
    printf("speedup fwd %.2fx fwd+bwd %.2fx (target: >= 3x fwd+bwd for n >= 2048)\n", std_fwd / fa_fwd, std_fb / fa_fb);
    cublasDestroy(g.h);
    return 0;
}
