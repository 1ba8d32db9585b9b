//! The checks every backend makes on a batch entry before it computes anything.

use super::{BatchEntry, ModelError};

/// What a batch entry must stay within: the model's vocabulary and context, and the KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLimits {
    /// Vocabulary size (token ids must be below it).
    pub vocab_size: usize,
    /// Context length, in tokens (positions must stay below it).
    pub context_length: usize,
    /// Blocks in the KV pool (block ids must be below it).
    pub num_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
}

impl EntryLimits {
    /// Checks entry number `entry` of a batch and returns how many KV blocks it covers
    /// (`ceil((start_pos + tokens.len()) / block_size)`).
    ///
    /// Errors: [`ModelError::EmptyInput`], [`ModelError::TooManyLogitTokens`],
    /// [`ModelError::TokenOutOfRange`],
    /// [`ModelError::ContextOverflow`], [`ModelError::BlockTableTooShort`],
    /// [`ModelError::BlockOutOfRange`] (among the blocks it covers).
    pub fn check(&self, entry: usize, e: &BatchEntry<'_>) -> Result<usize, ModelError> {
        if e.tokens.is_empty() {
            return Err(ModelError::EmptyInput { entry });
        }
        if e.logit_tokens > e.tokens.len() {
            return Err(ModelError::TooManyLogitTokens {
                entry,
                logit_tokens: e.logit_tokens,
                tokens: e.tokens.len(),
            });
        }
        if let Some(&token) = e.tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                entry,
                token,
                vocab_size: self.vocab_size,
            });
        }
        let end = e.start_pos.saturating_add(e.tokens.len());
        if end > self.context_length {
            return Err(ModelError::ContextOverflow {
                entry,
                needed: end,
                context_length: self.context_length,
            });
        }
        let needed = end.div_ceil(self.block_size);
        if e.block_table.len() < needed {
            return Err(ModelError::BlockTableTooShort {
                entry,
                needed,
                have: e.block_table.len(),
            });
        }
        if let Some(&block) = e.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= self.num_blocks)
        {
            return Err(ModelError::BlockOutOfRange {
                entry,
                block,
                num_blocks: self.num_blocks,
            });
        }
        Ok(needed)
    }
}
