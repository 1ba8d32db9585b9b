// Embedding lookup: out[r, :] = dequantize(table[tokens[r], :]) * scale, `hidden` wide, table in any
// weight format (Q8_0 for SmolLM2). `scale` is Gemma's sqrt(hidden) embedding scale, 1 for the other
// architectures (v * 1 == v). Grid: one block per row; block: any size. Values are the format's own
// decode times the scale, one f32 product as on the CPU, so they equal the CPU's Matrix::row_into
// (then `*v *= scale`) bit for bit in exact mode.
extern "C" __global__ void embedding(const u32* __restrict__ tokens, int n_rows, const u8* __restrict__ table,
                                     int fmt, int hidden, float scale, act_t* __restrict__ out) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const u8* row = table + (i64)tokens[r] * row_bytes_of(fmt, hidden);
    for (int c = threadIdx.x; c < hidden / CHUNK; c += blockDim.x) {
        float w[CHUNK];
        dequant_chunk_any(fmt, row, c, w);
#pragma unroll
        for (int i = 0; i < CHUNK; i++) st_act(out, (i64)r * hidden + c * CHUNK + i, __fmul_rn(w[i], scale));
    }
}
