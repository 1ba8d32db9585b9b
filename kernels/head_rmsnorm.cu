// Per-head RMSNorm of the Q and K heads of every row of the fused QKV activation, in place (Qwen 3's
// and Gemma 3's q/k norms, applied before RoPE), as worker/src/backend/cpu/ops.rs::rms_norm_chunks_in_place:
// each head_dim-wide head x becomes (x * scale) * w with scale = 1 / sqrt(mean(x^2) + eps), w = q_norm
// for the Q heads and k_norm for the K heads ([head_dim] each, f32). The mean of squares is summed in
// f64 sequentially in element order, by one lane, exactly as the CPU does, so the scale is bitwise the
// CPU's; V is untouched.
// Layout: row r of `qkv` is [q (n_heads*head_dim) | k (n_kv_heads*head_dim) | v], `width` wide.
// Grid: one block per row; block: HEAD_NORM_THREADS (a warp per head, heads w, w + 4, ...).
#define HEAD_NORM_THREADS 128

extern "C" __global__ void __launch_bounds__(HEAD_NORM_THREADS)
    head_rmsnorm(act_t* __restrict__ qkv, const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                 int n_rows, int width, int n_heads, int n_kv_heads, int head_dim, float eps) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int head = warp; head < n_heads + n_kv_heads; head += HEAD_NORM_THREADS / 32) {
        act_t* x = qkv + (i64)r * width + (i64)head * head_dim;
        const float* w = head < n_heads ? q_norm : k_norm;
        float scale = 0.0f;
        if (lane == 0) {
            double s = 0.0;
            for (int i = 0; i < head_dim; i++) {
                const double v = (double)ld_act(x, i);
                s = __dadd_rn(s, __dmul_rn(v, v));
            }
            scale = (float)(1.0 / sqrt(s / (double)head_dim + (double)eps));
        }
        scale = __shfl_sync(0xffffffffu, scale, 0);
        for (int i = lane; i < head_dim; i += 32) st_act(x, i, __fmul_rn(__fmul_rn(ld_act(x, i), scale), w[i]));
    }
}
