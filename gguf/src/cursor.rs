//! [`Cursor`]: the GGUF reader's bounds-checked little-endian reads of the header, metadata and
//! tensor infos, each failure a `Malformed` error naming the file, the offset and what was read.

use std::path::Path;

use crate::error::{GgufError, Result};
use crate::metadata::{MetadataArray, MetadataValue, ValueType};

/// Byte cursor over the mapped file that produces `Malformed` errors with offsets.
pub(crate) struct Cursor<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) path: &'a Path,
}

impl<'a> Cursor<'a> {
    pub(crate) fn err(&self, message: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(self.err(format!(
                "truncated while reading {what} at offset {} (need {n} bytes, {remaining} left)",
                self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Checks that `count` values of `ty` could possibly fit in the rest of the file.
    pub(crate) fn check_count(&self, count: u64, ty: ValueType, what: &str) -> Result<usize> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if count.saturating_mul(ty.min_encoded_size()) > remaining {
            return Err(self.err(format!(
                "{what}: array length {count} at offset {} exceeds the file size",
                self.pos
            )));
        }
        Ok(count as usize)
    }

    pub(crate) fn value_type(&mut self, what: &str) -> Result<ValueType> {
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| self.err(format!("{what}: unknown metadata value type {id}")))
    }

    pub(crate) fn value(&mut self, ty: ValueType, what: &str) -> Result<MetadataValue> {
        Ok(match ty {
            ValueType::U8 => MetadataValue::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => MetadataValue::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => MetadataValue::U32(self.u32(what)?),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::Bool => MetadataValue::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => MetadataValue::String(self.string(what)?),
            ValueType::Array => MetadataValue::Array(self.array_value(what)?),
            ValueType::U64 => MetadataValue::U64(self.u64(what)?),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    fn array_value(&mut self, what: &str) -> Result<MetadataArray> {
        let ty = self.value_type(what)?;
        let count = self.u64(what)?;
        let n = self.check_count(count, ty, what)?;
        macro_rules! collect {
            ($variant:ident, $conv:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($conv(self)?);
                }
                MetadataArray::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => MetadataArray::U8(self.take(count, what)?.to_vec()),
            ValueType::I8 => {
                MetadataArray::I8(self.take(count, what)?.iter().map(|&b| b as i8).collect())
            }
            ValueType::U16 => collect!(U16, |c: &mut Self| c.array(what).map(u16::from_le_bytes)),
            ValueType::I16 => collect!(I16, |c: &mut Self| c.array(what).map(i16::from_le_bytes)),
            ValueType::U32 => collect!(U32, |c: &mut Self| c.u32(what)),
            ValueType::I32 => collect!(I32, |c: &mut Self| c.array(what).map(i32::from_le_bytes)),
            ValueType::F32 => collect!(F32, |c: &mut Self| c.array(what).map(f32::from_le_bytes)),
            ValueType::Bool => {
                MetadataArray::Bool(self.take(count, what)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::String => collect!(String, |c: &mut Self| c.string(what)),
            ValueType::Array => collect!(Array, |c: &mut Self| c.array_value(what)),
            ValueType::U64 => collect!(U64, |c: &mut Self| c.u64(what)),
            ValueType::I64 => collect!(I64, |c: &mut Self| c.array(what).map(i64::from_le_bytes)),
            ValueType::F64 => collect!(F64, |c: &mut Self| c.array(what).map(f64::from_le_bytes)),
        })
    }
}
