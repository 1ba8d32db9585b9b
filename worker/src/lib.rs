//! The worker library.
