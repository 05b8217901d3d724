//! The ggml tensor types a GGUF file can name, with their block geometry.
//!
//! A tensor row is a sequence of blocks; each block packs `block_elements()`
//! values into `block_bytes()` bytes. The sizes are those of ggml's block
//! structs (ggml-common.h), so byte ranges computed here match llama.cpp's.

use super::q8::ActivationScales;

/// A ggml tensor type, by its id in the GGUF tensor info.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
}

/// (type, GGUF id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, u32, u32)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    // ids 4 and 5 (Q4_2, Q4_3) were removed from ggml and are invalid.
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "IQ2_XXS", 256, 66),
    (GgmlType::Iq2Xs, 17, "IQ2_XS", 256, 74),
    (GgmlType::Iq3Xxs, 18, "IQ3_XXS", 256, 98),
    (GgmlType::Iq1S, 19, "IQ1_S", 256, 50),
    (GgmlType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (GgmlType::Iq3S, 21, "IQ3_S", 256, 110),
    (GgmlType::Iq2S, 22, "IQ2_S", 256, 82),
    (GgmlType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::Iq1M, 29, "IQ1_M", 256, 56),
    (GgmlType::Bf16, 30, "BF16", 1, 2),
    // ids 31..33 and 36..38 (the repacked Q4_0_x_x / IQ4_NL_x_x layouts) were
    // removed from GGUF files and are invalid.
    (GgmlType::Tq1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// How llama.cpp's CPU dots of this weight format store their
    /// activations' scales (ggml-cpu's `vec_dot_type`: Q8_0 for Q4_0, Q5_0,
    /// Q8_0, IQ4_NL and MXFP4; Q8_1 for Q4_1 and Q5_1; Q8_K, an f32 scale
    /// per 256 values, for the K-quants and IQ4_XS).
    pub fn activation_scales(self) -> ActivationScales {
        match self {
            GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => ActivationScales::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 => ActivationScales::Q8_1,
            GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Iq4Xs => ActivationScales::Q8K,
            _ => ActivationScales::F32,
        }
    }

    /// The type with GGUF id `id`, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u32, u32) {
        // Every variant has exactly one row; the table test checks it.
        TABLE
            .iter()
            .find(|row| row.0 == self)
            .expect("every GgmlType has a table row")
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The name llama.cpp and gguf-py print for this type (e.g. `Q4_K`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values packed into one block.
    pub fn block_elements(self) -> u64 {
        u64::from(self.row().3)
    }

    /// Bytes one block occupies.
    pub fn block_bytes(self) -> u64 {
        u64::from(self.row().4)
    }

    /// Whether this build's backends compute with tensors of this type. The
    /// others are valid GGUF but rejected as unsupported at load time.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// The types this build computes with (on the CPU; the CUDA backend
    /// says which of them it takes).
    pub const SUPPORTED: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
        GgmlType::Mxfp4,
    ];

    /// Bytes of a row of `elements` values, or `None` when `elements` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_elements()) {
            return None;
        }
        (elements / self.block_elements()).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &(ty, id, ..) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!(ty.id(), id);
            assert_eq!(TABLE.iter().filter(|row| row.0 == ty).count(), 1);
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn block_sizes_match_ggml_block_structs() {
        // sizeof(block_q4_0) = half d + 16 nibble bytes, and so on (ggml-common.h).
        let expect = [
            (GgmlType::Q4_0, 2 + 16),
            (GgmlType::Q4_1, 2 + 2 + 16),
            (GgmlType::Q5_0, 2 + 4 + 16),
            (GgmlType::Q5_1, 2 + 2 + 4 + 16),
            (GgmlType::Q8_0, 2 + 32),
            (GgmlType::Q8_1, 2 + 2 + 32),
            (GgmlType::Q2K, 16 + 64 + 2 + 2),
            (GgmlType::Q3K, 32 + 64 + 12 + 2),
            (GgmlType::Q4K, 2 + 2 + 12 + 128),
            (GgmlType::Q5K, 2 + 2 + 12 + 32 + 128),
            (GgmlType::Q6K, 128 + 64 + 16 + 2),
            (GgmlType::Q8K, 4 + 256 + 2 * 16),
            (GgmlType::Iq4Nl, 2 + 16),
            (GgmlType::Iq4Xs, 2 + 2 + 4 + 128),
            (GgmlType::Mxfp4, 1 + 16),
        ];
        for (ty, bytes) in expect {
            assert_eq!(ty.block_bytes(), bytes, "{ty}");
        }
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::Q8_0.row_bytes(u64::MAX - 31), None);
    }
}
