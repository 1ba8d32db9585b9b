// Gathers rows of a [_, width] activation: out[i, :] = x[rows[i], :] (the rows whose logits are wanted,
// in batch order). Grid: one block per output row; block: any size.
extern "C" __global__ void gather_rows(const act_t* __restrict__ x, const int* __restrict__ rows, int n_out,
                                       int width, act_t* __restrict__ out) {
    const int i = blockIdx.x;
    if (i >= n_out) return;
    const i64 src = (i64)rows[i] * width;
    for (int d = threadIdx.x; d < width; d += blockDim.x) out[(i64)i * width + d] = x[src + d];
}
