//! A float64 attention reference shared by the CUDA tests (`cuda_gpu`, `cuda_host`).

/// float64 reference attention of one query at `pos` over keys `first..=pos` (rows of `keys` /
/// `values`, indexed by position), scores `q·k / sqrt(head_dim)` soft-capped to
/// `cap * tanh(s / cap)` when `softcap > 0`.
pub fn attention_ref(
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    first: usize,
    pos: usize,
    softcap: f32,
) -> Vec<f32> {
    let hd = q.len();
    let scale = 1.0 / (hd as f64).sqrt();
    let cap = softcap as f64;
    let s: Vec<f64> = (first..=pos)
        .map(|j| {
            let s = q
                .iter()
                .zip(&keys[j])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * scale;
            if cap > 0.0 {
                cap * (s / cap).tanh()
            } else {
                s
            }
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..hd)
        .map(|d| {
            let o: f64 = (first..=pos)
                .map(|j| e[j - first] * values[j][d] as f64)
                .sum();
            (o / z) as f32
        })
        .collect()
}
