// Rotary position embedding (Su et al. 2021) of the Q and K heads of every row of the fused QKV
// activation, in place, as worker/src/backend/cpu/ops.rs::RopeTable: pair i of a head is rotated by angle
// (pos * pos_scale) * base^(-2i / head_dim) / factors[i], the angle and its cos/sin computed in f64 and
// rounded to f32 exactly as the CPU table. `factors` ([head_dim / 2]) are Llama 3's per-frequency
// divisors (rope_freqs.weight); the host passes ones when the model has none (x / 1.0 == x), and
// pos_scale 1 without linear scaling.
// Pairing: neox = 0, adjacent pairs (x[2i], x[2i+1]) (GGUF llama weights, permuted by the converter);
// neox = 1, half-split pairs (x[i], x[i + head_dim/2]) (GPT-NeoX, Hugging Face rotate_half: Qwen,
// Gemma, Phi-3).
// Layout: row r of `qkv` is [q (n_heads*head_dim) | k (n_kv_heads*head_dim) | v], `width` wide.
// Grid: one block per row; block: any size (threads loop over the (head, pair) couples).
// Rows with a negative position (graph padding) are left alone.
extern "C" __global__ void rope(act_t* __restrict__ qkv, const int* __restrict__ positions, int n_rows, int width,
                                int n_heads, int n_kv_heads, int head_dim, float base, float pos_scale,
                                const float* __restrict__ factors, int neox) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const int pos = positions[r];
    if (pos < 0) return;
    const int half = head_dim / 2;
    const int pairs = (n_heads + n_kv_heads) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int head = p / half, i = p % half;
        const double inv_freq = pow((double)base, (-2.0 * (double)i) / (double)head_dim) / (double)factors[i];
        const double a = ((double)pos * (double)pos_scale) * inv_freq;
        const float c = (float)cos(a), s = (float)sin(a);
        const i64 h0 = (i64)r * width + (i64)head * head_dim;  // K heads follow Q heads
        const i64 o0 = neox ? h0 + i : h0 + 2 * i;
        const i64 o1 = neox ? h0 + i + half : h0 + 2 * i + 1;
        const float x0 = ld_act(qkv, o0), x1 = ld_act(qkv, o1);
        st_act(qkv, o0, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
        st_act(qkv, o1, __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
    }
}
