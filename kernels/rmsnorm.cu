// RMSNorm of every row: out = (x * scale) * weight, scale = 1 / sqrt(mean(x^2) + eps), as
// worker/src/backend/cpu/ops.rs::rms_norm; with `accumulate`, out += that instead (Gemma's post-attention
// and post-feed-forward norms: the normed block output is added to the residual stream, x += norm(y);
// x and out must then be different buffers). The mean of squares is accumulated in f64: thread t sums
// elements t, t + blockDim, ... in order, then a fixed pairwise tree over threads (block size fixed by the host,
// so the order depends only on `dim`, never on the number of rows). Grid: one block per row;
// block: RMSNORM_THREADS (256), dynamic shared memory: blockDim.x * 8 bytes.
extern "C" __global__ void rmsnorm(const act_t* __restrict__ x, const float* __restrict__ weight, int n_rows,
                                   int dim, float eps, act_t* __restrict__ out, int accumulate) {
    extern __shared__ double partial[];
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    double s = 0.0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const double v = (double)ld_act(x, (i64)r * dim + i);
        s = __dadd_rn(s, __dmul_rn(v, v));
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) partial[threadIdx.x] = __dadd_rn(partial[threadIdx.x], partial[threadIdx.x + h]);
        __syncthreads();
    }
    const double ms = partial[0] / (double)dim;
    const float scale = (float)(1.0 / sqrt(ms + (double)eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = ld_act(x, (i64)r * dim + i);
        const float y = __fmul_rn(__fmul_rn(v, scale), weight[i]);
        st_act(out, (i64)r * dim + i, accumulate ? __fadd_rn(ld_act(out, (i64)r * dim + i), y) : y);
    }
}
