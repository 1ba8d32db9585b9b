// Writes every row's K and V (RoPE applied) from the fused QKV activation into the paged KV cache of
// one layer: cache[slot, :] with slot = block_table[pos / block_size] * block_size + pos % block_size
// (packed on the host, see worker/src/backend/cuda/block_table.rs). Caches are [num_slots, kv_dim], same
// element type as the activations. Rows with slot < 0 (graph padding) write nothing.
// Grid: one block per row; block: any size.
extern "C" __global__ void kv_write(const act_t* __restrict__ qkv, const i64* __restrict__ slots, int n_rows,
                                    int width, int q_dim, int kv_dim, act_t* __restrict__ k_cache,
                                    act_t* __restrict__ v_cache) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const i64 slot = slots[r];
    if (slot < 0) return;
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) {
        k_cache[slot * kv_dim + d] = qkv[(i64)r * width + q_dim + d];
        v_cache[slot * kv_dim + d] = qkv[(i64)r * width + q_dim + kv_dim + d];
    }
}
