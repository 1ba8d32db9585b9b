// Device-side token selection over f32 logits [n_rows, vocab]: greedy argmax and top-k candidates, so
// that a step can return k (id, logit) pairs per row instead of the whole vocabulary.
//
// Order: larger logit first, lower id first among equal logits (the CPU sampler's tie rule); NaN
// logits are never selected. Launch: grid n_rows, block SELECT_THREADS (1024), no dynamic memory.
#define SELECT_THREADS 1024

// True when (v, i) comes before (bv, bi) in selection order.
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, id) of each thread's candidate, fixed tree over thread ids.
__device__ __forceinline__ void block_best(float& v, int& i, float* sv, int* si) {
    sv[threadIdx.x] = v;
    si[threadIdx.x] = i;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && before(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    v = sv[0];
    i = si[0];
    __syncthreads();
}

// ids[r] = argmax_j logits[r, j] (lowest id on ties; -1 when every logit is NaN).
extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
    argmax(const float* __restrict__ logits, int n_rows, int vocab, int* __restrict__ ids) {
    __shared__ float sv[SELECT_THREADS];
    __shared__ int si[SELECT_THREADS];
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    float bv = -INFINITY;
    int bi = -1;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float v = logits[(i64)r * vocab + j];
        if (!isnan(v) && (bi < 0 || before(v, j, bv, bi))) { bv = v; bi = j; }
    }
    if (bi < 0) bi = 0x7fffffff;
    block_best(bv, bi, sv, si);
    if (threadIdx.x == 0) ids[r] = bi == 0x7fffffff ? -1 : bi;
}

// The k best (id, logit) of each row in selection order: ids[r * k + n], vals[r * k + n]. Round n picks
// the best candidate strictly after round n - 1's pick in selection order (k rounds over the row).
extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
    topk(const float* __restrict__ logits, int n_rows, int vocab, int k, int* __restrict__ ids,
         float* __restrict__ vals) {
    __shared__ float sv[SELECT_THREADS];
    __shared__ int si[SELECT_THREADS];
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    float pv = INFINITY;
    int pi = -1;
    for (int n = 0; n < k; n++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float v = logits[(i64)r * vocab + j];
            if (!isnan(v) && before(pv, pi, v, j) && before(v, j, bv, bi)) { bv = v; bi = j; }
        }
        block_best(bv, bi, sv, si);
        if (threadIdx.x == 0) {
            ids[(i64)r * k + n] = bi == 0x7fffffff ? -1 : bi;
            vals[(i64)r * k + n] = bv;
        }
        pv = bv;
        pi = bi;
    }
}
