//! The keys of a query in the paged layer: where their rows lie ([`key_offsets`]) and how many
//! a kernel call scores or sums at once ([`WIDE_KEYS`] on AVX-512, [`NARROW_KEYS`] elsewhere; every
//! kernel groups keys the same way, aligned to the absolute key index).

/// Keys scored (and value rows summed) per kernel call on AVX-512: 16 lane
/// sums share one transposed reduction. Measured on the 2-core test machine
/// against 4 keys and a scalar `Σ p_j v_j` loop, together with the vectorised
/// [`add_scaled`](super::super::matmul::add_scaled) and an aligned cache: 512-token
/// prefill 358-391 -> 476-479 tok/s, 32-stream decode (context 128) 272-278 ->
/// 334-336 tok/s.
pub(super) const WIDE_KEYS: usize = 16;
/// The same on the other paths, whose 16 registers hold 4 rows' accumulators
/// without spilling.
pub(super) const NARROW_KEYS: usize = 4;

/// Fills `offsets` with the offset in the layer (`[num_slots, kv_dim]`) of the row of the KV
/// head starting at column `kv_off`, for positions `keys` in order, block by block through
/// `block_table` (no division per key: at 4096 keys, two divisions per key and pass cost more
/// than the dot products).
///
/// Panics if `block_table` does not cover `keys` (checked by the model before).
pub(super) fn key_offsets(
    block_table: &[u32],
    block_size: usize,
    kv_dim: usize,
    kv_off: usize,
    keys: std::ops::Range<usize>,
    offsets: &mut Vec<usize>,
) {
    offsets.clear();
    let mut pos = keys.start;
    while pos < keys.end {
        let (block, within) = (pos / block_size, pos % block_size);
        let first = (block_table[block] as usize * block_size + within) * kv_dim + kv_off;
        let take = (block_size - within).min(keys.end - pos);
        offsets.extend((0..take).map(|i| first + i * kv_dim));
        pos += take;
    }
}
