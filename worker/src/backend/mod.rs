//! The backends and the seam they share with the engine.
//!
//! - The seam: [`BatchEntry`] and [`BatchModel`] (what the engine asks of a backend: run one flat
//!   batch over paged KV blocks, give back logits), [`EntryLimits`] and the [`StepPlan`] (every
//!   backend's checks of a batch and its KV slot layout, slot conflicts included), [`ModelError`]
//!   (loading a model and checking a batch, for every backend) and [`StepError`] (why a step
//!   failed).
//! - [`cpu`]: the f32 forward pass with the project's own SIMD kernels.
//! - [`cuda`]: the same forward pass on an NVIDIA GPU (NVRTC-compiled kernels of `kernels/`).
//!
//! Both backends read the neutral model description of [`crate::arch`]; neither imports the other,
//! and the engine (`crate::engine`) depends only on this seam. Adding a backend is one folder here
//! that implements [`BatchModel`].

mod batch;
pub mod cpu;
pub mod cuda;
mod entry_limits;
mod error;
pub(crate) mod step_plan;

pub use batch::{BatchEntry, BatchModel, Logits};
pub use entry_limits::EntryLimits;
pub use error::{ModelError, StepError};
pub use step_plan::{PlannedToken, StepPlan};
