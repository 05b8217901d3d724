//! A weight as the backends see it: a tensor of the GGUF data section in its
//! stored format. Backends resolve a [`Weight`] to their own copy (the CPU
//! reads it from the file's mapping, a GPU from the copy it uploaded).

use crate::gguf::TensorInfo;
use crate::quant::GgmlType;

/// A weight matrix (or vector: one row) in its stored format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    pub ty: GgmlType,
    pub rows: usize,
    /// Values per row (GGUF's first dimension).
    pub cols: usize,
    /// Byte range inside the data section.
    pub offset: usize,
    pub n_bytes: usize,
}

impl Weight {
    /// The weight a tensor of the file describes.
    pub fn from_info(info: &TensorInfo) -> Weight {
        Weight {
            ty: info.ggml_type,
            rows: (info.n_elements() / info.dims[0]) as usize,
            cols: info.dims[0] as usize,
            offset: info.offset as usize,
            n_bytes: info.n_bytes as usize,
        }
    }

    pub fn row_bytes(&self) -> usize {
        self.n_bytes / self.rows
    }

    /// Part `i` of `n` equal parts along the rows: expert i's matrix of a
    /// 3-D expert tensor (ggml order: the experts are its outermost
    /// dimension, each a contiguous run of whole rows).
    pub fn part(&self, i: usize, n: usize) -> Weight {
        assert!(
            i < n && self.rows.is_multiple_of(n),
            "part {i} of {n} of {self:?}"
        );
        let rows = self.rows / n;
        let n_bytes = rows * self.row_bytes();
        Weight {
            rows,
            offset: self.offset + i * n_bytes,
            n_bytes,
            ..*self
        }
    }
}
