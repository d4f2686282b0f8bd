// weft's own CUDA kernels, for the networks' operations that candle runs as chains of
// separate launches: group norm (with SiLU), GEGLU, and attention without its score matrix
// in device memory. Compiled to PTX by build.rs when the `cuda` feature is on; launched from
// src/cuda/mod.rs. Arithmetic is in float32 whatever the storage type, as PyTorch's kernels
// for these operations do, except the tensor-core products of attention (16-bit operands,
// float32 sums).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

__device__ __forceinline__ float load(const float v) { return v; }
__device__ __forceinline__ float load(const __half v) { return __half2float(v); }
__device__ __forceinline__ float load(const __nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T store(float v);
template <> __device__ __forceinline__ float store<float>(float v) { return v; }
template <> __device__ __forceinline__ __half store<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v, float *shared) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// One block per (image, group) of an NCHW tensor: the group's `per_group * spatial` values
// are contiguous. Two passes for the moments (mean, then the centred sum of squares), a
// third writes `(x - mean) / sqrt(var + eps) * weight[c] + bias[c]`, then SiLU if `silu`.
template <typename T>
__device__ void group_norm(const T *x, T *y, const T *weight, const T *bias, int channels, int groups,
                           int spatial, float eps, int silu) {
    __shared__ float shared[32];
    const int per_group = channels / groups;
    const long long len = (long long)per_group * spatial;
    const long long base = (long long)blockIdx.x * len;
    const int first_channel = (blockIdx.x % groups) * per_group;
    float sum = 0.0f;
    for (long long i = threadIdx.x; i < len; i += blockDim.x) sum += load(x[base + i]);
    const float mean = block_sum(sum, shared) / (float)len;
    float squares = 0.0f;
    for (long long i = threadIdx.x; i < len; i += blockDim.x) {
        const float d = load(x[base + i]) - mean;
        squares += d * d;
    }
    const float inv_std = rsqrtf(block_sum(squares, shared) / (float)len + eps);
    for (long long i = threadIdx.x; i < len; i += blockDim.x) {
        const int c = first_channel + (int)(i / spatial);
        float v = (load(x[base + i]) - mean) * inv_std * load(weight[c]) + load(bias[c]);
        if (silu) v = v / (1.0f + __expf(-v));
        y[base + i] = store<T>(v);
    }
}

// `y[r, c] = a * gelu(g)` for the row `x[r] = [a | g]` of width `2 * half`, GELU exact (erf).
template <typename T>
__device__ void geglu(const T *x, T *y, long long rows, int half) {
    const long long n = rows * half;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / half;
        const int c = (int)(i % half);
        const float a = load(x[r * 2 * half + c]);
        const float g = load(x[r * 2 * half + half + c]);
        y[i] = store<T>(a * 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)));
    }
}

#define INSTANTIATE(NAME, T)                                                                           \
    extern "C" __global__ void group_norm_##NAME(const T *x, T *y, const T *weight, const T *bias,   \
                                                 int channels, int groups, int spatial, float eps,    \
                                                 int silu) {                                           \
        group_norm<T>(x, y, weight, bias, channels, groups, spatial, eps, silu);                       \
    }                                                                                                  \
    extern "C" __global__ void geglu_##NAME(const T *x, T *y, long long rows, int half) {             \
        geglu<T>(x, y, rows, half);                                                                    \
    }

INSTANTIATE(f32, float)
INSTANTIATE(f16, __half)
INSTANTIATE(bf16, __nv_bfloat16)

// Attention, flash style: softmax(q kᵀ · scale) v with a running maximum and sum per query
// row, so the scores never leave shared memory. One block of 4 warps per 64 query rows of one
// head of one image; each warp owns 16 rows. Keys and values come in tiles of 64 rows. The
// head's width `d` is padded with zeros to `DP`, a multiple of 16 (tensor-core tiles are
// 16x16x16). Rows of q, k and v are `*_row` elements apart and images `*_image`; the head's
// columns are adjacent. The output is [image, query, head * d], contiguous.
namespace attention {
constexpr int BLOCK_M = 64;
constexpr int BLOCK_N = 64;
constexpr int WARPS = 4;

// Copies `rows` rows of `d` columns (zero past `valid` rows and `d` columns) into a
// [BLOCK_M][DP] tile.
template <typename T, int DP>
__device__ void load_tile(T *tile, const T *source, int row_stride, int valid, int d) {
    for (int i = threadIdx.x; i < BLOCK_M * DP; i += blockDim.x) {
        const int r = i / DP, c = i % DP;
        tile[i] = (r < valid && c < d) ? source[(long long)r * row_stride + c] : store<T>(0.0f);
    }
}

template <typename T, int DP>
__device__ void forward(const T *q, const T *k, const T *v, T *o, int n, int m, int heads, int d,
                        long long q_image, int q_row, long long k_image, int k_row, long long v_image,
                        int v_row, float scale) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char shared[];
    T *qs = reinterpret_cast<T *>(shared);
    T *ks = qs + BLOCK_M * DP;
    T *vs = ks + BLOCK_N * DP;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *scores = reinterpret_cast<float *>(vs + BLOCK_N * DP) + warp * 16 * BLOCK_N;
    T *probs = reinterpret_cast<T *>(reinterpret_cast<float *>(vs + BLOCK_N * DP) + WARPS * 16 * BLOCK_N) +
               warp * 16 * BLOCK_N;
    float *acc = reinterpret_cast<float *>(reinterpret_cast<T *>(reinterpret_cast<float *>(vs + BLOCK_N * DP) +
                                                                 WARPS * 16 * BLOCK_N) +
                                           WARPS * 16 * BLOCK_N);
    float *sums = acc + WARPS * 16 * DP + warp * 16;
    acc += warp * 16 * DP;

    const int head = blockIdx.y, image = blockIdx.z, first = blockIdx.x * BLOCK_M;
    load_tile<T, DP>(qs, q + image * q_image + (long long)first * q_row + head * d, q_row, n - first, d);
    for (int i = lane; i < 16 * DP; i += 32) acc[i] = 0.0f;
    // Lanes 2r and 2r + 1 share row r of the warp's 16: each takes half of its columns.
    const int row = lane / 2, half = lane % 2;
    float row_max = -INFINITY, row_sum = 0.0f;

    for (int start = 0; start < m; start += BLOCK_N) {
        __syncthreads();
        load_tile<T, DP>(ks, k + image * k_image + (long long)start * k_row + head * d, k_row, m - start, d);
        load_tile<T, DP>(vs, v + image * v_image + (long long)start * v_row + head * d, v_row, m - start, d);
        __syncthreads();
        // The warp's scores: its 16 query rows against the tile's 64 keys.
        for (int j = 0; j < BLOCK_N / 16; ++j) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
            wmma::fill_fragment(s, 0.0f);
            for (int kk = 0; kk < DP / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                wmma::load_matrix_sync(a, qs + warp * 16 * DP + kk * 16, DP);
                wmma::load_matrix_sync(b, ks + j * 16 * DP + kk * 16, DP);
                wmma::mma_sync(s, a, b, s);
            }
            wmma::store_matrix_sync(scores + j * 16, s, BLOCK_N, wmma::mem_row_major);
        }
        __syncwarp();
        // Running maximum and sum of the row; probabilities relative to the new maximum.
        const int valid = min(BLOCK_N, m - start);
        const float *srow = scores + row * BLOCK_N;
        float tile_max = -INFINITY;
        for (int c = half * BLOCK_N / 2; c < (half + 1) * BLOCK_N / 2; ++c)
            if (c < valid) tile_max = fmaxf(tile_max, srow[c] * scale);
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
        const float new_max = fmaxf(row_max, tile_max);
        const float rescale = __expf(row_max - new_max);
        float tile_sum = 0.0f;
        for (int c = half * BLOCK_N / 2; c < (half + 1) * BLOCK_N / 2; ++c) {
            const float p = c < valid ? __expf(srow[c] * scale - new_max) : 0.0f;
            probs[row * BLOCK_N + c] = store<T>(p);
            tile_sum += p;
        }
        tile_sum += __shfl_xor_sync(0xffffffff, tile_sum, 1);
        row_sum = row_sum * rescale + tile_sum;
        row_max = new_max;
        for (int c = half * DP / 2; c < (half + 1) * DP / 2; ++c) acc[row * DP + c] *= rescale;
        __syncwarp();
        // acc += probabilities · the tile's values.
        for (int c = 0; c < DP / 16; ++c) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> out;
            wmma::load_matrix_sync(out, acc + c * 16, DP, wmma::mem_row_major);
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                wmma::load_matrix_sync(a, probs + kk * 16, BLOCK_N);
                wmma::load_matrix_sync(b, vs + kk * 16 * DP + c * 16, DP);
                wmma::mma_sync(out, a, b, out);
            }
            wmma::store_matrix_sync(acc + c * 16, out, DP, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (half == 0) sums[row] = row_sum;
    __syncwarp();
    for (int i = lane; i < 16 * d; i += 32) {
        const int r = i / d, c = i % d, query = first + warp * 16 + r;
        if (query < n) {
            const float total = sums[r];
            o[((long long)image * n + query) * heads * d + (long long)head * d + c] =
                store<T>(total > 0.0f ? acc[r * DP + c] / total : 0.0f);
        }
    }
}
}  // namespace attention

#define ATTENTION(NAME, T, DP)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) flash_attention_##NAME##_##DP(                     \
        const T *q, const T *k, const T *v, T *o, int n, int m, int heads, int d, long long q_image,     \
        int q_row, long long k_image, int k_row, long long v_image, int v_row, float scale) {           \
        attention::forward<T, DP>(q, k, v, o, n, m, heads, d, q_image, q_row, k_image, k_row, v_image,   \
                                  v_row, scale);                                                         \
    }
#define ATTENTION_WIDTHS(NAME, T) \
    ATTENTION(NAME, T, 48) ATTENTION(NAME, T, 64) ATTENTION(NAME, T, 80) ATTENTION(NAME, T, 96) \
    ATTENTION(NAME, T, 128) ATTENTION(NAME, T, 160)
ATTENTION_WIDTHS(f16, __half)
ATTENTION_WIDTHS(bf16, __nv_bfloat16)
