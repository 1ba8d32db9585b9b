// Rotary position embedding of the Q and K heads of every row of the fused QKV activation, in place,
// in the adjacent-pair form of worker/src/model/ops.rs::RopeTable::apply (GGUF llama weights): pair
// (x[2i], x[2i+1]) of each head is rotated by angle pos * base^(-2i / head_dim), the angle and its cos/sin
// computed in f64 and rounded to f32, exactly as the CPU table.
// Layout: row r of `qkv` is [q (n_heads*head_dim) | k (n_kv_heads*head_dim) | v], `width` wide.
// Grid: one block per row; block: any size (threads loop over the (head, pair) couples).
// Rows with a negative position (graph padding) are left alone.
extern "C" __global__ void rope(act_t* __restrict__ qkv, const int* __restrict__ positions, int n_rows, int width,
                                int n_heads, int n_kv_heads, int head_dim, float base) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const int pos = positions[r];
    if (pos < 0) return;
    const int half = head_dim / 2;
    const int pairs = (n_heads + n_kv_heads) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int head = p / half, i = p % half;
        const double inv_freq = pow((double)base, (-2.0 * (double)i) / (double)head_dim);
        const double a = (double)pos * inv_freq;
        const float c = (float)cos(a), s = (float)sin(a);
        const i64 off = (i64)r * width + (i64)head * head_dim + 2 * i;  // K heads follow Q heads
        const float x0 = ld_act(qkv, off), x1 = ld_act(qkv, off + 1);
        st_act(qkv, off, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
        st_act(qkv, off + 1, __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
    }
}
