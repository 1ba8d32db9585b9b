// Paged attention, one full pass per (query row, head): the decode kernel, and in exact mode the kernel
// for every query (prefill chunks too), mirroring worker/src/backend/cpu/attention/.
//
// Query row r (RoPE applied, inside the fused QKV activation, `width` wide) at position positions[r]
// attends to its sequence's keys first..=pos (first = pos + 1 - window with a sliding window,
// window > 0; else 0), read through block table table_index[r] of the packed [n_tables, max_blocks]
// block_tables (slot = table[j / block_size] * block_size + j % block_size). Query head h uses KV
// head h / (n_heads / n_kv_heads). Scores q.k * scale, soft-capped to tanh(s / softcap) * softcap
// when softcap > 0 (Gemma 2), softmax in f32 over the pos + 1 - first scores, output sum_j p_j v_j.
// Rows with a negative position (graph padding) are skipped.
//
// Fixed order (batch and chunking invariant; the key range depends on pos and window only). Below, j
// counts keys from `first`: score j is one warp's dot (lane l sums dims l, l + 32, ...
// in order, then warp_sum); the max and the sum of exponentials go through block_max / block_sum over a
// fixed 128 threads (thread t sums j = t, t + 128, ... in order); the output dim d is accumulated by
// G = 128 / head_dim thread groups (group g takes j = g, g + G, ... in increasing j), then the G partial
// sums are added in group order; a head wider than 128 (a multiple of it) has thread t sum dims
// t, t + 128, ... over all j in increasing order. None of it depends on the other rows or on how the prompt was chunked.
//
// Launch: grid (n_rows, n_heads), block 128 (head_dim divides 128 or is a multiple of it), dynamic shared memory
// (head_dim + 256 + max_keys) * 4 bytes, max_keys >= the number of keys of every row.
#define ATT_THREADS 128

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_decode(const act_t* __restrict__ qkv, int width, const int* __restrict__ positions,
                     const int* __restrict__ table_index, const u32* __restrict__ block_tables, int max_blocks,
                     const act_t* __restrict__ k_cache, const act_t* __restrict__ v_cache, int block_size,
                     int n_heads, int n_kv_heads, int head_dim, float scale, act_t* __restrict__ out, int n_rows, float softcap,
                     int window) {
    extern __shared__ float smem[];
    const int r = blockIdx.x, h = blockIdx.y;
    if (r >= n_rows) return;
    const int pos = positions[r];
    if (pos < 0) return;
    float* q = smem;                    // [head_dim]
    float* red = q + head_dim;          // [128]
    float* part = red + ATT_THREADS;    // [128]
    float* p = part + ATT_THREADS;      // [n_keys]
    const int kv_dim = n_kv_heads * head_dim;
    const int kv_off = (h / (n_heads / n_kv_heads)) * head_dim;
    const u32* table = block_tables + (i64)table_index[r] * max_blocks;
    const int first = first_key(pos, window);
    const int n_keys = pos + 1 - first;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q[d] = ld_act(qkv, (i64)r * width + h * head_dim + d);
    __syncthreads();
    for (int j = warp; j < n_keys; j += ATT_THREADS / 32) {
        const int key = first + j;
        const i64 slot = (i64)table[key / block_size] * block_size + key % block_size;
        const act_t* kr = k_cache + slot * kv_dim + kv_off;
        float dot = 0.0f;
        for (int d = lane; d < head_dim; d += 32) dot = fmaf(q[d], ld_act(kr, d), dot);
        dot = warp_sum(dot);
        if (lane == 0) p[j] = softcap_score(__fmul_rn(dot, scale), softcap);
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n_keys; j += ATT_THREADS) mx = fmaxf(mx, p[j]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n_keys; j += ATT_THREADS) {
        const float e = expf(__fsub_rn(p[j], mx));
        p[j] = e;
        sum = __fadd_rn(sum, e);
    }
    sum = block_sum(sum, red);  // ends with a barrier: every p[j] is written
    const float inv = __fdiv_rn(1.0f, sum);
    if (head_dim > ATT_THREADS) {
        // Wide heads (Gemma's 256): thread t owns dims t, t + 128, ..., each a sum over j in order.
        for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) {
            float acc = 0.0f;
            for (int j = 0; j < n_keys; j++) {
                const int key = first + j;
                const i64 slot = (i64)table[key / block_size] * block_size + key % block_size;
                acc = fmaf(__fmul_rn(p[j], inv), ld_act(v_cache, slot * kv_dim + kv_off + d), acc);
            }
            st_act(out, (i64)r * n_heads * head_dim + h * head_dim + d, acc);
        }
        return;
    }
    const int groups = ATT_THREADS / head_dim;
    const int g = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    float acc = 0.0f;
    if (g < groups) {
        for (int j = g; j < n_keys; j += groups) {
            const int key = first + j;
            const i64 slot = (i64)table[key / block_size] * block_size + key % block_size;
            acc = fmaf(__fmul_rn(p[j], inv), ld_act(v_cache, slot * kv_dim + kv_off + d), acc);
        }
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float o = part[threadIdx.x];
        for (int gg = 1; gg < groups; gg++) o = __fadd_rn(o, part[gg * head_dim + threadIdx.x]);
        st_act(out, (i64)r * n_heads * head_dim + h * head_dim + threadIdx.x, o);
    }
}
