// Embedding lookup: out[r, :] = dequantize(table[tokens[r], :]), `hidden` wide, table in any weight
// format (Q8_0 for SmolLM2). Grid: one block per row; block: any size. Values are exact (no arithmetic
// besides the format's own decode), so they equal the CPU's Matrix::row_into bit for bit in exact mode.
extern "C" __global__ void embedding(const u32* __restrict__ tokens, int n_rows, const u8* __restrict__ table,
                                     int fmt, int hidden, act_t* __restrict__ out) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const u8* row = table + (i64)tokens[r] * row_bytes_of(fmt, hidden);
    for (int c = threadIdx.x; c < hidden / CHUNK; c += blockDim.x) {
        float w[CHUNK];
        dequant_chunk_any(fmt, row, c, w);
#pragma unroll
        for (int i = 0; i < CHUNK; i++) st_act(out, (i64)r * hidden + c * CHUNK + i, w[i]);
    }
}
