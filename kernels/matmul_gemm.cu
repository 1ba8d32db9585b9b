// Tiled dequantizing matrix-matrix kernels for prefill and large batches (m > 8 rows), one per weight
// format; same operation and arguments as matmul_gemv.cu.
//
// Tile: 16 rows x 16 outputs per block of 256 threads (8 warps x 2 outputs). The activation tile is
// staged in shared memory one slab of 256 columns (32 chunks of 8) at a time; in slab s, lane l of every
// warp takes chunk 32 s + l, decodes it once for the warp's outputs and multiplies it against the 16
// staged rows. So lane l still visits its chunks l, l + 32, ... in increasing order, elements 0..7 in
// order, with the same fmaf, and the lane sums go through the same warp_sum butterfly: exactly the
// reduction order of matmul_gemv.cu, hence bitwise the same result for every (row, output) whichever
// kernel runs and whatever m is (exact mode). The tile only changes how often weights are re-read.
#define GEMM_ROWS 16
#define GEMM_WARPS 8
#define GEMM_OUTS_PER_WARP 2
#define GEMM_SLAB (32 * CHUNK)

template <int FMT>
__device__ __forceinline__ void gemm_body(const u8* __restrict__ w, int n_out, int k, const act_t* __restrict__ x,
                                          int x_stride, int m, void* out, int out_stride, int out_off,
                                          int accumulate, int out_f32) {
    __shared__ float xs[GEMM_ROWS][GEMM_SLAB];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o0 = (blockIdx.x * GEMM_WARPS + warp) * GEMM_OUTS_PER_WARP;
    const int r0 = blockIdx.y * GEMM_ROWS;
    const int nc = k / CHUNK;
    float acc[GEMM_OUTS_PER_WARP][GEMM_ROWS];
#pragma unroll
    for (int j = 0; j < GEMM_OUTS_PER_WARP; j++)
#pragma unroll
        for (int t = 0; t < GEMM_ROWS; t++) acc[j][t] = 0.0f;
    const i64 rb = row_bytes_of(FMT, k);
    for (int base = 0; base < k; base += GEMM_SLAB) {
        for (int e = threadIdx.x; e < GEMM_ROWS * GEMM_SLAB; e += blockDim.x) {
            const int t = e / GEMM_SLAB, col = base + e % GEMM_SLAB;
            xs[t][e % GEMM_SLAB] = (r0 + t < m && col < k) ? ld_act(x, (i64)(r0 + t) * x_stride + col) : 0.0f;
        }
        __syncthreads();
        const int c = base / CHUNK + lane;
        if (c < nc) {
#pragma unroll
            for (int j = 0; j < GEMM_OUTS_PER_WARP; j++) {
                if (o0 + j < n_out) {
                    float wv[CHUNK];
                    dequant_chunk<FMT>(w + (i64)(o0 + j) * rb, c, wv);
#pragma unroll
                    for (int t = 0; t < GEMM_ROWS; t++)
#pragma unroll
                        for (int i = 0; i < CHUNK; i++) acc[j][t] = fmaf(wv[i], xs[t][lane * CHUNK + i], acc[j][t]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < GEMM_OUTS_PER_WARP; j++) {
#pragma unroll
        for (int t = 0; t < GEMM_ROWS; t++) {
            const float s = warp_sum(acc[j][t]);
            if (lane == 0 && o0 + j < n_out && r0 + t < m)
                store_out(out, out_f32, (i64)(r0 + t) * out_stride + out_off + o0 + j, s, accumulate);
        }
    }
}

#define GEMM_KERNEL(NAME, FMT)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
        gemm_##NAME(const u8* __restrict__ w, int n_out, int k, const act_t* __restrict__ x, int x_stride, \
                    int m, void* out, int out_stride, int out_off, int accumulate, int out_f32) {           \
        gemm_body<FMT>(w, n_out, k, x, x_stride, m, out, out_stride, out_off, accumulate, out_f32);        \
    }

GEMM_KERNEL(f32, FMT_F32)
GEMM_KERNEL(f16, FMT_F16)
GEMM_KERNEL(bf16, FMT_BF16)
GEMM_KERNEL(q4_0, FMT_Q4_0)
GEMM_KERNEL(q4_1, FMT_Q4_1)
GEMM_KERNEL(q8_0, FMT_Q8_0)
GEMM_KERNEL(q5_0, FMT_Q5_0)
GEMM_KERNEL(q5_1, FMT_Q5_1)
GEMM_KERNEL(q4_k, FMT_Q4_K)
GEMM_KERNEL(q5_k, FMT_Q5_K)
GEMM_KERNEL(q6_k, FMT_Q6_K)
