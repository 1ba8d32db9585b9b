//! Launch shapes (grid, block, dynamic shared memory) of every kernel, computed on the host from the
//! problem sizes; the numbers match the `#define`s and launch comments in `kernels/`.

use cudarc::driver::LaunchConfig;

use super::error::LaunchShapeError;

/// Rows up to which the matrix kernels use `gemv_*` (4 rows per warp pass); above, `gemm_*`.
pub const GEMV_MAX_ROWS: usize = 8;
/// Threads of the row-wise kernels (embedding, RoPE, KV write, gather).
pub const ROW_THREADS: u32 = 128;
/// Threads of `rmsnorm` (its f64 reduction tree; fixed, so the order depends on `dim` only).
pub const RMSNORM_THREADS: u32 = 256;
/// Threads of `attention_decode` (`ATT_THREADS`).
pub const ATTENTION_THREADS: u32 = 128;
/// Widest head `attention_prefill` handles (`PF_MAX_DIM`); wider heads run every query through
/// `attention_decode`, in fast mode too.
pub const PREFILL_MAX_HEAD_DIM: usize = 128;
/// Threads of `head_rmsnorm` (`HEAD_NORM_THREADS`: one warp per head).
pub const HEAD_NORM_THREADS: u32 = 128;
/// Threads of `argmax` / `topk` (`SELECT_THREADS`).
pub const SELECT_THREADS: u32 = 1024;
/// Most dynamic shared memory a kernel gets without opting in, bytes.
pub const DEFAULT_SMEM_LIMIT: usize = 48 * 1024;

/// Which matrix kernel runs for `m` rows. Both have the same reduction order per output (see
/// `kernels/matmul_gemv.cu`), so the choice never changes a value in exact mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// `gemv_*`: 4 warps x 1 output, 4 rows per block.
    Gemv,
    /// `gemm_*`: 8 warps x 2 outputs, 16 rows per block, activation slabs in shared memory.
    Gemm,
}

impl MatmulKernel {
    /// The kernel for `m` rows.
    pub fn for_rows(m: usize) -> MatmulKernel {
        if m <= GEMV_MAX_ROWS {
            MatmulKernel::Gemv
        } else {
            MatmulKernel::Gemm
        }
    }

    /// Kernel name prefix: `gemv` or `gemm`.
    pub fn prefix(self) -> &'static str {
        match self {
            MatmulKernel::Gemv => "gemv",
            MatmulKernel::Gemm => "gemm",
        }
    }

    /// Launch shape for `m` rows and `n_out` outputs.
    pub fn shape(self, m: usize, n_out: usize) -> LaunchConfig {
        let (outs, rows, threads) = match self {
            MatmulKernel::Gemv => (4, 4, 128),
            MatmulKernel::Gemm => (16, 16, 256),
        };
        LaunchConfig {
            grid_dim: (n_out.div_ceil(outs) as u32, m.div_ceil(rows) as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// One block per row (`n_rows` blocks of `threads`).
pub fn per_row(n_rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n_rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `rmsnorm`: one block of [`RMSNORM_THREADS`] per row, an f64 per thread of shared memory.
pub fn rmsnorm(n_rows: usize) -> LaunchConfig {
    LaunchConfig {
        shared_mem_bytes: RMSNORM_THREADS * 8,
        ..per_row(n_rows, RMSNORM_THREADS)
    }
}

/// `head_rmsnorm`: one block of [`HEAD_NORM_THREADS`] per row.
pub fn head_rmsnorm(n_rows: usize) -> LaunchConfig {
    per_row(n_rows, HEAD_NORM_THREADS)
}

/// Elementwise grid-stride kernels (`swiglu`, `geglu`, `bias_add`, `softcap`) over `total` elements: 256 threads, at most 65535 blocks.
pub fn elementwise(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (total.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Dynamic shared memory of `attention_decode` for keys up to `max_keys`: q, two 128-float scratch
/// arrays and the scores, f32.
pub fn attention_decode_smem(head_dim: usize, max_keys: usize) -> usize {
    (head_dim + 2 * ATTENTION_THREADS as usize + max_keys) * 4
}

/// `attention_decode`: grid (rows, heads), 128 threads.
///
/// Errors: [`LaunchShapeError::HeadDim`] when `head_dim` neither divides 128 nor is a multiple of it
/// (the kernel's thread groups), [`LaunchShapeError::SharedMemory`] when the shared memory needed
/// exceeds `smem_limit` (the opt-in limit set at load).
pub fn attention_decode(
    n_rows: usize,
    n_heads: usize,
    head_dim: usize,
    max_keys: usize,
    smem_limit: usize,
) -> Result<LaunchConfig, LaunchShapeError> {
    let threads = ATTENTION_THREADS as usize;
    if head_dim == 0 || !(threads.is_multiple_of(head_dim) || head_dim.is_multiple_of(threads)) {
        return Err(LaunchShapeError::HeadDim { head_dim, threads });
    }
    let smem = attention_decode_smem(head_dim, max_keys);
    if smem > smem_limit {
        return Err(LaunchShapeError::SharedMemory {
            max_keys,
            smem,
            limit: smem_limit,
        });
    }
    Ok(LaunchConfig {
        grid_dim: (n_rows.max(1) as u32, n_heads as u32, 1),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

/// `attention_prefill`: grid (tiles, heads), 128 threads, static shared memory only.
pub fn attention_prefill(n_tiles: usize, n_heads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n_tiles.max(1) as u32, n_heads as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_shapes() {
        assert_eq!(MatmulKernel::for_rows(1), MatmulKernel::Gemv);
        assert_eq!(MatmulKernel::for_rows(8), MatmulKernel::Gemv);
        assert_eq!(MatmulKernel::for_rows(9), MatmulKernel::Gemm);
        let c = MatmulKernel::Gemv.shape(3, 960);
        assert_eq!((c.grid_dim, c.block_dim.0), ((240, 1, 1), 128));
        let c = MatmulKernel::Gemm.shape(512, 1537);
        assert_eq!((c.grid_dim, c.block_dim.0), ((97, 32, 1), 256));
        assert_eq!(MatmulKernel::Gemm.prefix(), "gemm");
    }

    #[test]
    fn row_and_elementwise_shapes() {
        assert_eq!(per_row(0, 128).grid_dim.0, 1);
        assert_eq!(rmsnorm(7).shared_mem_bytes, 2048);
        assert_eq!(head_rmsnorm(3).block_dim.0, 128);
        assert_eq!(elementwise(1536 * 3).grid_dim.0, 18);
        assert_eq!(elementwise(usize::MAX / 2).grid_dim.0, 65_535);
    }

    #[test]
    fn attention_shapes_and_limits() {
        let c = attention_decode(5, 9, 64, 8192, DEFAULT_SMEM_LIMIT).unwrap();
        assert_eq!(c.grid_dim, (5, 9, 1));
        assert_eq!(c.shared_mem_bytes as usize, (64 + 256 + 8192) * 4);
        assert_eq!(
            attention_decode(1, 9, 48, 10, DEFAULT_SMEM_LIMIT)
                .unwrap_err()
                .to_string(),
            "head_dim 48 must divide 128 or be a multiple of it"
        );
        assert!(attention_decode(1, 9, 192, 10, DEFAULT_SMEM_LIMIT).is_err());
        // Gemma's 256-wide heads: whole multiples of the block.
        let c = attention_decode(2, 4, 256, 100, DEFAULT_SMEM_LIMIT).unwrap();
        assert_eq!(c.shared_mem_bytes as usize, (256 + 256 + 100) * 4);
        assert_eq!(
            attention_decode(1, 9, 64, 20_000, DEFAULT_SMEM_LIMIT)
                .unwrap_err()
                .to_string(),
            "attention over 20000 keys needs 81280 bytes of shared memory, the limit is 49152"
        );
        assert_eq!(attention_prefill(3, 9).grid_dim, (3, 9, 1));
    }
}
