//! The CUDA backend's K/V store: the K/V values of the paged blocks of every layer in device memory
//! (the CPU backend's `kv_store` holds them in host memory), addressed through the engine's block
//! tables (`engine::kv`, the block manager) exactly like the CPU store, plus the step buffers and
//! decode graphs that point into them (the engine owns all of it as
//! [`engine::backend::BatchModel::Kv`]).

use cudarc::driver::CudaSlice;

use super::buffers::StepBuffers;
use super::graphs::DecodeGraphs;

/// The paged K/V blocks of every layer on the GPU: per layer one K and one V buffer of
/// `[num_blocks * block_size, kv_dim]` activation elements (f32 exact, bf16 fast).
pub struct KvBlocks {
    pub(super) k: Vec<CudaSlice<u8>>,
    pub(super) v: Vec<CudaSlice<u8>>,
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
}

/// The CUDA backend's [`engine::backend::BatchModel::Kv`]: the K/V blocks (managed by the engine's block manager like
/// the CPU cache), plus the step buffers and decode graphs that point into them.
pub struct GpuKv {
    pub(super) blocks: KvBlocks,
    pub(super) buffers: Option<StepBuffers>,
    pub(super) graphs: DecodeGraphs,
}

impl GpuKv {
    pub(super) fn split(&mut self) -> (&KvBlocks, &mut StepBuffers) {
        (
            &self.blocks,
            self.buffers.as_mut().expect("step buffers allocated"),
        )
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.blocks.block_size
    }

    /// Decode graphs captured so far.
    pub fn graphs_captured(&self) -> usize {
        self.graphs.len()
    }
}
