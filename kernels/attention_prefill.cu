// Chunked-prefill attention (fast mode): causal, variable length, tiled online softmax in the manner of
// FlashAttention (Dao et al. 2022), over the paged KV cache.
//
// Work unit: a tile of up to 16 consecutive query rows of one sequence (rows row0 .. row0 + nq at
// positions pos0 .. pos0 + nq), described by tiles[4 t .. 4 t + 4] = {row0, nq, pos0, table}; grid
// (n_tiles, n_heads), block 128 (4 warps x 4 queries; lane l owns dims l, l + 32, ... of the head, at
// most 4, so head_dim <= 128). Keys are staged 32 at a time (K and V tiles in shared memory, read
// through the block table) and every query folds each visible key (first_key(its position, window)
// <= j <= its position) into a running
// max m, normaliser l and output accumulator: m' = max(m, s), acc = acc * e^(m - m') + e^(s - m') v_j.
// Scores are scaled and, when softcap > 0, soft-capped as in attention_decode.cu; with a sliding window
// (window > 0) the key loop starts at the 32-key tile holding the first query's first key.
// The result depends on the tile split, so exact mode uses attention_decode.cu for every query instead.
#define PF_QUERIES 16
#define PF_KEYS 32
#define PF_MAX_DIM 128

extern "C" __global__ void __launch_bounds__(128, 1)
    attention_prefill(const act_t* __restrict__ qkv, int width, const int* __restrict__ tiles,
                      const u32* __restrict__ block_tables, int max_blocks, const act_t* __restrict__ k_cache,
                      const act_t* __restrict__ v_cache, int block_size, int n_heads, int n_kv_heads, int head_dim,
                      float scale, act_t* __restrict__ out, float softcap, int window) {
    __shared__ float ks[PF_KEYS][PF_MAX_DIM];
    __shared__ float vs[PF_KEYS][PF_MAX_DIM];
    const int t = blockIdx.x, h = blockIdx.y;
    const int row0 = tiles[4 * t], nq = tiles[4 * t + 1], pos0 = tiles[4 * t + 2], ti = tiles[4 * t + 3];
    const u32* table = block_tables + (i64)ti * max_blocks;
    const int kv_dim = n_kv_heads * head_dim;
    const int kv_off = (h / (n_heads / n_kv_heads)) * head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_lane = (head_dim + 31) / 32;
    float qv[4][4], acc[4][4], m[4], l[4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int qi = warp * 4 + a;
        m[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int d = lane + 32 * b;
            acc[a][b] = 0.0f;
            qv[a][b] = (qi < nq && b < per_lane && d < head_dim)
                           ? ld_act(qkv, (i64)(row0 + qi) * width + h * head_dim + d)
                           : 0.0f;
        }
    }
    const int last = pos0 + nq - 1;
    for (int j0 = first_key(pos0, window) / PF_KEYS * PF_KEYS; j0 <= last; j0 += PF_KEYS) {
        for (int e = threadIdx.x; e < PF_KEYS * head_dim; e += blockDim.x) {
            const int jj = e / head_dim, d = e % head_dim, j = j0 + jj;
            float kv = 0.0f, vv = 0.0f;
            if (j <= last) {
                const i64 slot = (i64)table[j / block_size] * block_size + j % block_size;
                kv = ld_act(k_cache, slot * kv_dim + kv_off + d);
                vv = ld_act(v_cache, slot * kv_dim + kv_off + d);
            }
            ks[jj][d] = kv;
            vs[jj][d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int qi = warp * 4 + a;
            if (qi >= nq) continue;  // warp-uniform
            const int pos = pos0 + qi;
            const int from = max(first_key(pos, window) - j0, 0);
            for (int jj = from; jj < PF_KEYS && j0 + jj <= pos; jj++) {
                float dot = 0.0f;
#pragma unroll
                for (int b = 0; b < 4; b++)
                    if (b < per_lane && lane + 32 * b < head_dim) dot = fmaf(qv[a][b], ks[jj][lane + 32 * b], dot);
                const float s = softcap_score(warp_sum(dot) * scale, softcap);
                const float mn = fmaxf(m[a], s);
                const float corr = expf(m[a] - mn), e = expf(s - mn);
                l[a] = l[a] * corr + e;
#pragma unroll
                for (int b = 0; b < 4; b++)
                    if (b < per_lane && lane + 32 * b < head_dim) acc[a][b] = acc[a][b] * corr + e * vs[jj][lane + 32 * b];
                m[a] = mn;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int qi = warp * 4 + a;
        if (qi >= nq) continue;
        const float inv = 1.0f / l[a];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int d = lane + 32 * b;
            if (b < per_lane && d < head_dim)
                st_act(out, (i64)(row0 + qi) * n_heads * head_dim + h * head_dim + d, acc[a][b] * inv);
        }
    }
}
