//! The seam between the engine and the backends.
//!
//! - [`BatchEntry`] and [`BatchModel`] (what the engine asks of a backend: run one flat
//!   batch over paged KV blocks, give back logits), [`EntryLimits`] and the [`StepPlan`] (every
//!   backend's checks of a batch and its KV slot layout, slot conflicts included), [`ModelError`]
//!   (loading a model and checking a batch, for every backend) and [`StepError`] (why a step
//!   failed).
//! - The backends are crates of their own: `backend-cpu` (the f32 forward pass with the project's
//!   own SIMD kernels) and `backend-cuda` (the same forward pass on an NVIDIA GPU, NVRTC-compiled
//!   kernels of `kernels/`).
//!
//! Both backends read the neutral model description of [`model_desc`]; neither depends on the
//! other, and the engine depends only on this seam (Cargo enforces it: the engine crate depends on
//! no backend). Adding a backend is one crate that implements [`BatchModel`].

mod batch;
mod entry_limits;
mod error;
mod step_plan;

pub use batch::{BatchEntry, BatchModel, Logits};
pub use entry_limits::EntryLimits;
pub use error::{ModelError, StepError};
#[cfg(any(test, feature = "testing"))]
pub use step_plan::test_batch;
pub use step_plan::{PlannedToken, StepPlan};
