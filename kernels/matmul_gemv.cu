// Dequantizing matrix-vector kernels for decode-sized batches (m <= 8 rows), one per weight format:
// out[r, out_off + o] (+)= sum_k W[o, k] * x[r, k] with W a row-major [n_out, k] matrix in the GGUF
// format (bytes as in the file) and x a [m, k] activation with row stride x_stride.
//
// Reduction order (the batch-invariance contract, shared with matmul_gemm.cu): the output (r, o) is
// computed by one warp. Lane l accumulates, starting from 0, the chunks c = l, l + 32, l + 64, ... of
// 8 consecutive elements (c < k / 8) in increasing c, and within a chunk elements 0..7 in order, with
// acc = fmaf(w, x, acc); then the 32 lane sums are combined by the fixed butterfly of warp_sum. This
// order depends on k only: not on m, on the tile the row falls in, or on which kernel variant runs, so
// every row's result is bitwise the same at any batch size (exact mode).
//
// Launch: block 128 threads (4 warps, one output each), grid (ceil(n_out / 4), ceil(m / 4)); each warp
// handles 4 rows, decoding every weight chunk once for the 4 rows.
#define GEMV_ROWS 4
#define GEMV_WARPS 4

template <int FMT>
__device__ __forceinline__ void gemv_body(const u8* __restrict__ w, int n_out, int k, const act_t* __restrict__ x,
                                          int x_stride, int m, void* out, int out_stride, int out_off,
                                          int accumulate, int out_f32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = blockIdx.x * GEMV_WARPS + warp;
    const int r0 = blockIdx.y * GEMV_ROWS;
    if (o >= n_out) return;  // warp-uniform
    const u8* row = w + (i64)o * row_bytes_of(FMT, k);
    float acc[GEMV_ROWS];
#pragma unroll
    for (int t = 0; t < GEMV_ROWS; t++) acc[t] = 0.0f;
    const int nc = k / CHUNK;
    for (int c = lane; c < nc; c += 32) {
        float wv[CHUNK];
        dequant_chunk<FMT>(row, c, wv);
#pragma unroll
        for (int t = 0; t < GEMV_ROWS; t++) {
            if (r0 + t < m) {
                const i64 xo = (i64)(r0 + t) * x_stride + (i64)c * CHUNK;
#pragma unroll
                for (int i = 0; i < CHUNK; i++) acc[t] = fmaf(wv[i], ld_act(x, xo + i), acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_ROWS; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && r0 + t < m) store_out(out, out_f32, (i64)(r0 + t) * out_stride + out_off + o, s, accumulate);
    }
}

#define GEMV_KERNEL(NAME, FMT)                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        gemv_##NAME(const u8* __restrict__ w, int n_out, int k, const act_t* __restrict__ x, int x_stride, \
                    int m, void* out, int out_stride, int out_off, int accumulate, int out_f32) {           \
        gemv_body<FMT>(w, n_out, k, x, x_stride, m, out, out_stride, out_off, accumulate, out_f32);        \
    }

GEMV_KERNEL(f32, FMT_F32)
GEMV_KERNEL(f16, FMT_F16)
GEMV_KERNEL(bf16, FMT_BF16)
GEMV_KERNEL(q4_0, FMT_Q4_0)
GEMV_KERNEL(q4_1, FMT_Q4_1)
GEMV_KERNEL(q8_0, FMT_Q8_0)
GEMV_KERNEL(q5_0, FMT_Q5_0)
GEMV_KERNEL(q5_1, FMT_Q5_1)
GEMV_KERNEL(q4_k, FMT_Q4_K)
GEMV_KERNEL(q5_k, FMT_Q5_K)
GEMV_KERNEL(q6_k, FMT_Q6_K)
