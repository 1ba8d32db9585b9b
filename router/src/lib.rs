//! The router library.
