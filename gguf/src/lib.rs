//! GGUF files (placeholder, filled in by the gguf module work).
