//! The CUDA backend: the forward pass of every architecture on an NVIDIA GPU, behind the same
//! [`engine::backend::BatchModel`] interface as the CPU model, so the scheduler, KV block manager and
//! sampler are shared.
//!
//! A crate of its own so that Cargo enforces the seam: it depends on the engine (for the
//! `BatchModel` seam) and on `model-desc`, never on the CPU backend, `inference-proto` or `tonic`.
//!
//! - [`device`]: the `device` setting (`cpu | cuda | auto`) and GPU discovery through the driver,
//!   loaded at run time with cudarc (nothing CUDA is needed to build, or to run the CPU backend).
//! - [`kernels`]: the `.cu` sources of `kernels/`, embedded; [`compile`]: NVRTC to CUBIN for the
//!   GPU's own architecture, in the `exact` or `fast` [`Numerics`] ([`numerics`]), and the ptxas
//!   resource report;
//!   [`cache`]: the on-disk module cache keyed by (source hash, architecture, mode).
//! - [`weights`]: weights uploaded in the file's formats; [`block_table`]: a step's packed inputs
//!   (block tables, slots, positions, logit rows, prefill tiles); [`buffers`]: the persistent step
//!   buffers; [`launch`]: launch shapes; [`graphs`]: decode batch buckets and captured CUDA graphs.
//! - [`kv_store`]: the K/V values of the blocks in device memory ([`GpuKv`]), addressed through the
//!   engine's block tables (the CPU backend's `kv_store` holds them in host memory).
//! - [`model`]: [`CudaModel`], the forward pass and the `BatchModel` impl.
//! - [`error`]: [`CudaError`], what can fail in all of the above.

pub mod block_table;
pub mod buffers;
pub mod cache;
pub mod compile;
pub mod device;
pub mod error;
pub mod graphs;
pub mod kernels;
pub mod kv_store;
pub mod launch;
pub mod model;
pub mod numerics;
pub mod weights;

pub use device::{choose_backend, probe, Backend, DeviceKind, GpuInfo};
pub use error::CudaError;
pub use kv_store::GpuKv;
pub use model::{CudaModel, CudaOptions};
pub use numerics::Numerics;
