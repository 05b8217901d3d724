//! A corpus of malformed and unsupported GGUF files. Every case is loaded
//! through the in-memory path (`GgufFile::from_bytes` + `Model::from_gguf`)
//! and through `Model::load` of a file (mapped and read), and must fail with
//! the exact error kind and a message that says why. A seeded mutation test
//! checks that no corruption makes the loader panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use common::gguf_writer::{
    tt, vt, GgufWriter, Layout, Meta, KV_COUNT_AT, TENSOR_COUNT_AT, VERSION_AT,
};
use common::tiny_model::{tiny_model, tiny_model_with, TINY};
use m40llm::backend::Device;
use m40llm::error::{Error, ErrorKind};
use m40llm::gguf::{GgufFile, MAX_ARRAY_NESTING};
use m40llm::model::{LoadOptions, Model};

// ---------------------------------------------------------------------------
// Loading through every path
// ---------------------------------------------------------------------------

fn load_options(use_mmap: bool) -> LoadOptions {
    LoadOptions {
        device: -1,
        n_threads: 1,
        use_mmap,
        vocab_only: false,
    }
}

fn load_from_bytes(bytes: &[u8]) -> Result<Model, Error> {
    let gguf = GgufFile::from_bytes(bytes)?;
    Model::from_gguf(gguf, Device::Cpu { threads: 1 }, load_options(false))
}

/// What one way of loading did: loaded, failed, or panicked.
enum Outcome {
    Loaded,
    Failed(Error),
    Panicked(String),
}

fn run(f: impl FnOnce() -> Result<Model, Error>) -> Outcome {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => Outcome::Loaded,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(payload) => Outcome::Panicked(
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

/// Loads `bytes` in memory, from a mapped file and from a read file.
fn load_every_way(name: &str, bytes: &[u8]) -> Vec<(String, Outcome)> {
    let path = common::scratch_path(&format!("malformed-{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    let outcomes = vec![
        (
            "from_bytes + Model::from_gguf".to_string(),
            run(|| load_from_bytes(bytes)),
        ),
        (
            format!("Model::load({}, use_mmap: true)", path.display()),
            run(|| Model::load(&path, load_options(true))),
        ),
        (
            format!("Model::load({}, use_mmap: false)", path.display()),
            run(|| Model::load(&path, load_options(false))),
        ),
    ];
    std::fs::remove_file(&path).unwrap();
    outcomes
}

// ---------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------

struct Case {
    name: String,
    bytes: Vec<u8>,
    kind: ErrorKind,
    /// Words the message must contain (besides the file name for file loads).
    words: Vec<String>,
}

struct Corpus(Vec<Case>);

impl Corpus {
    fn add(&mut self, name: &str, bytes: Vec<u8>, kind: ErrorKind, words: &[&str]) {
        self.0.push(Case {
            name: name.to_string(),
            bytes,
            kind,
            words: words.iter().map(|w| w.to_string()).collect(),
        });
    }
    fn format(&mut self, name: &str, bytes: Vec<u8>, words: &[&str]) {
        self.add(name, bytes, ErrorKind::Format, words);
    }
    fn unsupported(&mut self, name: &str, bytes: Vec<u8>, words: &[&str]) {
        self.add(name, bytes, ErrorKind::Unsupported, words);
    }
}

fn llama() -> GgufWriter {
    tiny_model("llama")
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn kv_index(w: &GgufWriter, key: &str) -> usize {
    w.kvs
        .iter()
        .position(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no key {key}"))
}

fn tensor_index(w: &GgufWriter, name: &str) -> usize {
    w.tensors
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

/// Offset of the value (after the type id) of metadata entry `key`.
fn value_at(w: &GgufWriter, layout: &Layout, key: &str) -> usize {
    layout.kv_type_at[kv_index(w, key)] + 4
}

/// Offset of the data offset field of tensor `name`.
fn offset_field_at(w: &GgufWriter, layout: &Layout, name: &str) -> usize {
    layout.tensor_type_at[tensor_index(w, name)] + 4
}

/// Offset of dimension `d` of tensor `name`.
fn dim_at(w: &GgufWriter, layout: &Layout, name: &str, d: usize) -> usize {
    layout.tensor_ndims_at[tensor_index(w, name)] + 4 + 8 * d
}

/// Moves metadata entry `key` to the end, so that a file cut inside it still
/// holds enough bytes for the declared counts and reports the truncation.
fn with_kv_last(key: &str) -> GgufWriter {
    let mut w = llama();
    let entry = w.kvs.remove(kv_index(&w, key));
    w.kvs.push(entry);
    w
}

/// `llama()` with one change made to the writer.
fn llama_with(f: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    let mut w = llama();
    f(&mut w);
    w.build()
}

/// `llama()` built, with one change made to its bytes.
fn llama_patched(f: impl FnOnce(&GgufWriter, &Layout, &mut Vec<u8>)) -> Vec<u8> {
    let w = llama();
    let (mut bytes, layout) = w.build_with_layout();
    f(&w, &layout, &mut bytes);
    bytes
}

/// Arrays nested `levels` deep, the innermost holding one u8.
fn nested_array(levels: u32) -> Meta {
    let mut m = Meta::Array(vt::U8, vec![Meta::U8(1)]);
    for _ in 1..levels {
        m = Meta::Array(vt::ARRAY, vec![m]);
    }
    m
}

fn raw_array(elem: u32, count: u64, payload: &[u8]) -> Meta {
    let mut bytes = elem.to_le_bytes().to_vec();
    bytes.extend(count.to_le_bytes());
    bytes.extend(payload);
    Meta::Raw(vt::ARRAY, bytes)
}

fn corpus() -> Vec<Case> {
    let mut c = Corpus(Vec::new());
    let (base, layout) = llama().build_with_layout();
    let base_w = llama();
    let last_tensor = base_w.tensors.len() - 1;
    assert_eq!(base_w.tensors[last_tensor].name, "output.weight");

    // --- The fixed header: magic, version, counts. -----------------------
    c.format(
        "truncated_in_magic",
        base[..2].to_vec(),
        &[
            "truncated at offset 0",
            "GGUF magic",
            "needs 4 bytes, 2 left",
        ],
    );
    let mut b = base.clone();
    b[..4].copy_from_slice(b"GGUG");
    c.format("bad_magic", b, &["not a GGUF file", "magic"]);
    let mut b = base.clone();
    b[..4].copy_from_slice(b"gguf");
    c.format("lowercase_magic", b, &["not a GGUF file"]);
    c.format(
        "truncated_in_version",
        base[..6].to_vec(),
        &["truncated at offset 4", "GGUF version"],
    );
    let version = |v: u32| {
        let mut b = base.clone();
        put_u32(&mut b, VERSION_AT, v);
        b
    };
    c.unsupported(
        "version_1",
        version(1),
        &["GGUF version 1 is not supported"],
    );
    c.unsupported(
        "big_endian_version_3",
        version(3u32.swap_bytes()),
        &["big-endian"],
    );
    c.unsupported(
        "big_endian_version_2",
        version(2u32.swap_bytes()),
        &["big-endian"],
    );
    c.format("version_99", version(99), &["unknown GGUF version 99"]);
    c.format("version_0", version(0), &["unknown GGUF version 0"]);
    c.format(
        "version_u32_max",
        version(u32::MAX),
        &["unknown GGUF version 4294967295"],
    );
    c.format(
        "truncated_in_tensor_count",
        base[..12].to_vec(),
        &["truncated at offset 8", "tensor count"],
    );
    c.format(
        "truncated_in_kv_count",
        base[..20].to_vec(),
        &["truncated at offset 16", "metadata entry count"],
    );
    c.format(
        "truncated_after_counts",
        base[..24].to_vec(),
        &["metadata section", "claims 13 elements"],
    );
    let count = |at: usize, v: u64| {
        let mut b = base.clone();
        put_u64(&mut b, at, v);
        b
    };
    c.format(
        "huge_kv_count_u64_max",
        count(KV_COUNT_AT, u64::MAX),
        &["metadata section", "claims 18446744073709551615 elements"],
    );
    c.format(
        "huge_kv_count_2_pow_40",
        count(KV_COUNT_AT, 1 << 40),
        &["metadata section", "claims 1099511627776 elements"],
    );
    c.format(
        "huge_tensor_count_u64_max",
        count(TENSOR_COUNT_AT, u64::MAX),
        &[
            "tensor info section",
            "claims 18446744073709551615 elements",
        ],
    );
    c.format(
        "huge_tensor_count_2_pow_40",
        count(TENSOR_COUNT_AT, 1 << 40),
        &["tensor info section", "claims 1099511627776 elements"],
    );

    // --- Metadata: truncation. --------------------------------------------
    {
        let w = with_kv_last("general.name");
        let (b, l) = w.build_with_layout();
        let kv = *l.kv_at.last().unwrap();
        let i = w.kvs.len() - 1;
        let key_of = format!("the key of metadata entry {i}");
        c.format(
            "truncated_in_metadata_key_length",
            b[..kv + 3].to_vec(),
            &[
                &format!("truncated at offset {kv}"),
                &format!("the length of {key_of}"),
            ],
        );
        c.format(
            "truncated_in_metadata_key",
            b[..kv + 8 + 5].to_vec(),
            &[
                &format!("truncated at offset {}", kv + 8),
                &key_of,
                "needs 12 bytes, 5 left",
            ],
        );
        let ty = *l.kv_type_at.last().unwrap();
        c.format(
            "truncated_in_metadata_value_type",
            b[..ty + 2].to_vec(),
            &[
                "truncated",
                &format!("offset {ty}"),
                "the value type of metadata key 'general.name'",
            ],
        );
        c.format(
            "truncated_in_string_value_length",
            b[..ty + 4 + 5].to_vec(),
            &["truncated", "the length of metadata key 'general.name'"],
        );
        c.format(
            "truncated_in_string_value_body",
            b[..ty + 4 + 8 + 3].to_vec(),
            &[
                "truncated",
                &format!("offset {}", ty + 12),
                "metadata key 'general.name' needs 15 bytes, 3 left",
            ],
        );
    }
    {
        let w = with_kv_last("llama.context_length");
        let (b, l) = w.build_with_layout();
        let v = *l.kv_type_at.last().unwrap() + 4;
        c.format(
            "truncated_in_u32_value",
            b[..v + 2].to_vec(),
            &[
                &format!("truncated at offset {v}"),
                "metadata key 'llama.context_length' needs 4 bytes, 2 left",
            ],
        );
    }
    {
        // tokens are "tok0".."tok15": 8 + 4 bytes each for the first ten,
        // 8 + 5 for the rest. The cut is late enough that the 16 elements'
        // 8-byte minimum still fits, so the string itself is found short.
        let w = with_kv_last("tokenizer.ggml.tokens");
        let (b, l) = w.build_with_layout();
        let first = *l.kv_type_at.last().unwrap() + 4 + 4 + 8;
        let element_12 = first + 10 * 12 + 2 * 13;
        c.format(
            "truncated_in_string_array_body",
            b[..element_12 + 8 + 2].to_vec(),
            &[
                "truncated",
                &format!("offset {}", element_12 + 8),
                "element 12 of metadata key 'tokenizer.ggml.tokens' needs 5 bytes, 2 left",
            ],
        );
        c.format(
            "truncated_in_array_element_count",
            b[..first - 3].to_vec(),
            &[
                "truncated",
                "the element count of metadata key 'tokenizer.ggml.tokens'",
            ],
        );
        c.format(
            "truncated_in_array_element_type",
            b[..first - 10].to_vec(),
            &[
                "truncated",
                "the value type of the elements of metadata key 'tokenizer.ggml.tokens'",
            ],
        );
    }
    {
        // Fixed-size elements: the count is checked against the bytes left
        // before anything is read.
        let w = with_kv_last("tokenizer.ggml.scores");
        let (b, l) = w.build_with_layout();
        let first = *l.kv_type_at.last().unwrap() + 4 + 4 + 8;
        c.format(
            "truncated_in_f32_array_body",
            b[..first + 4 * 7 + 1].to_vec(),
            &[
                "metadata key 'tokenizer.ggml.scores' claims 16 elements",
                &format!("offset {first}"),
                "29 bytes left",
            ],
        );
    }

    // --- Metadata: hostile lengths and counts. -----------------------------
    c.format(
        "huge_key_length_u64_max",
        llama_patched(|_, l, b| put_u64(b, l.kv_at[0], u64::MAX)),
        &[
            "truncated",
            "the key of metadata entry 0 needs 18446744073709551615 bytes",
        ],
    );
    c.format(
        "huge_string_length_u64_max",
        llama_patched(|w, l, b| put_u64(b, value_at(w, l, "general.name"), u64::MAX)),
        &[
            "truncated",
            "metadata key 'general.name' needs 18446744073709551615 bytes",
        ],
    );
    c.format(
        "huge_string_length_2_pow_40",
        llama_patched(|w, l, b| put_u64(b, value_at(w, l, "general.name"), 1 << 40)),
        &[
            "truncated",
            "metadata key 'general.name' needs 1099511627776 bytes",
        ],
    );
    c.format(
        "huge_array_count_u64_max",
        llama_patched(|w, l, b| put_u64(b, value_at(w, l, "tokenizer.ggml.tokens") + 4, u64::MAX)),
        &["metadata key 'tokenizer.ggml.tokens' claims 18446744073709551615 elements"],
    );
    c.format(
        "huge_array_count_2_pow_40",
        llama_patched(|w, l, b| put_u64(b, value_at(w, l, "tokenizer.ggml.scores") + 4, 1 << 40)),
        &["metadata key 'tokenizer.ggml.scores' claims 1099511627776 elements"],
    );
    c.format(
        "huge_array_count_in_a_nested_array",
        llama_with(|w| {
            let mut inner = vt::U8.to_le_bytes().to_vec();
            inner.extend((1u64 << 40).to_le_bytes());
            w.set_kv("test.nested", raw_array(vt::ARRAY, 1, &inner));
        }),
        &["element 0 of metadata key 'test.nested' claims 1099511627776 elements"],
    );
    c.format(
        "huge_string_length_in_a_string_array",
        llama_with(|w| {
            w.set_kv(
                "test.strings",
                raw_array(vt::STRING, 1, &u64::MAX.to_le_bytes()),
            )
        }),
        &[
            "truncated",
            "element 0 of metadata key 'test.strings' needs 18446744073709551615 bytes",
        ],
    );

    // --- Metadata: bad values. --------------------------------------------
    c.format(
        "unknown_metadata_value_type_13",
        llama_with(|w| w.set_kv("test.bad", Meta::Raw(13, vec![0; 8]))),
        &["metadata key 'test.bad' has unknown value type 13"],
    );
    c.format(
        "unknown_metadata_value_type_u32_max",
        llama_patched(|w, l, b| put_u32(b, l.kv_type_at[kv_index(w, "general.name")], u32::MAX)),
        &["metadata key 'general.name' has unknown value type 4294967295"],
    );
    c.format(
        "unknown_array_element_type",
        llama_with(|w| w.set_kv("test.bad", raw_array(13, 1, &[0; 8]))),
        &["the elements of metadata key 'test.bad' has unknown value type 13"],
    );
    c.format(
        "bool_byte_2",
        llama_with(|w| w.set_kv("test.flag", Meta::Raw(vt::BOOL, vec![2]))),
        &["metadata key 'test.flag'", "bool with byte value 2"],
    );
    c.format(
        "bool_array_element_byte_255",
        llama_with(|w| w.set_kv("test.flags", raw_array(vt::BOOL, 3, &[1, 0, 255]))),
        &[
            "element 2 of metadata key 'test.flags'",
            "bool with byte value 255",
        ],
    );
    c.format(
        "invalid_utf8_in_key",
        llama_patched(|w, l, b| b[l.kv_at[kv_index(w, "general.name")] + 8 + 3] = 0xFF),
        &["the key of metadata entry 1", "not valid UTF-8"],
    );
    c.format(
        "utf16_surrogate_in_key",
        llama_patched(|w, l, b| {
            let at = l.kv_at[kv_index(w, "general.name")] + 8 + 3;
            b[at..at + 3].copy_from_slice(&[0xED, 0xA0, 0x80]);
        }),
        &["the key of metadata entry 1", "not valid UTF-8"],
    );
    c.format(
        "invalid_utf8_in_string_value",
        llama_with(|w| {
            let mut s = Vec::new();
            s.extend(3u64.to_le_bytes());
            s.extend([b'a', 0xC3, b'(']);
            w.set_kv("general.name", Meta::Raw(vt::STRING, s));
        }),
        &["metadata key 'general.name'", "not valid UTF-8"],
    );
    c.format(
        "invalid_utf8_in_string_array_element",
        llama_patched(|w, l, b| {
            b[value_at(w, l, "tokenizer.ggml.tokens") + 12 + 3 * 12 + 8] = 0xC0
        }),
        &[
            "element 3 of metadata key 'tokenizer.ggml.tokens'",
            "not valid UTF-8",
        ],
    );
    c.format(
        "empty_metadata_key",
        llama_with(|w| w.kvs.push((String::new(), Meta::U32(1)))),
        &["metadata entry 13 has an empty key"],
    );
    c.format(
        "duplicate_metadata_key",
        llama_with(|w| w.kvs.push(("general.name".to_string(), Meta::str("again")))),
        &["duplicate metadata key 'general.name'"],
    );
    c.format(
        "arrays_nested_one_level_too_deep",
        llama_with(|w| w.set_kv("test.deep", nested_array(MAX_ARRAY_NESTING + 1))),
        &[
            "metadata key 'test.deep'",
            &format!("nests arrays deeper than {MAX_ARRAY_NESTING} levels"),
        ],
    );
    c.format(
        "arrays_nested_10000_levels",
        llama_with(|w| {
            // Encoded directly: each level is (type ARRAY, count 1).
            let mut payload = Vec::new();
            for _ in 0..10_000 {
                payload.extend(vt::ARRAY.to_le_bytes());
                payload.extend(1u64.to_le_bytes());
            }
            payload.extend(vt::U8.to_le_bytes());
            payload.extend(0u64.to_le_bytes());
            w.set_kv("test.deep", Meta::Raw(vt::ARRAY, payload));
        }),
        &["metadata key 'test.deep'", "nests arrays deeper than"],
    );

    // --- Tensor infos. -----------------------------------------------------
    {
        let info = layout.tensor_info_at[last_tensor];
        c.format(
            "truncated_in_tensor_name",
            base[..info + 8 + 4].to_vec(),
            &[
                "truncated",
                &format!("the name of tensor {last_tensor} needs 13 bytes, 4 left"),
            ],
        );
        let dims = layout.tensor_ndims_at[last_tensor];
        c.format(
            "truncated_in_tensor_n_dims",
            base[..dims + 1].to_vec(),
            &["truncated", "the dimension count of tensor 'output.weight'"],
        );
        c.format(
            "truncated_in_tensor_dims",
            base[..dims + 4 + 8 + 5].to_vec(),
            &[
                "truncated",
                &format!("offset {}", dims + 12),
                "dimension 1 of tensor 'output.weight' needs 8 bytes, 5 left",
            ],
        );
        let ty = layout.tensor_type_at[last_tensor];
        c.format(
            "truncated_in_tensor_type",
            base[..ty + 3].to_vec(),
            &["truncated", "the type of tensor 'output.weight'"],
        );
        c.format(
            "truncated_in_tensor_offset",
            base[..ty + 4 + 6].to_vec(),
            &[
                "truncated",
                "the data offset of tensor 'output.weight' needs 8 bytes, 6 left",
            ],
        );
    }
    let n_dims = |v: u32| {
        llama_patched(|w, l, b| {
            put_u32(
                b,
                l.tensor_ndims_at[tensor_index(w, "blk.0.attn_q.weight")],
                v,
            )
        })
    };
    c.format(
        "n_dims_0",
        n_dims(0),
        &["tensor 'blk.0.attn_q.weight' has 0 dimensions"],
    );
    c.format(
        "n_dims_5",
        n_dims(5),
        &["tensor 'blk.0.attn_q.weight' has 5 dimensions"],
    );
    c.format(
        "n_dims_u32_max",
        n_dims(u32::MAX),
        &["tensor 'blk.0.attn_q.weight' has 4294967295 dimensions"],
    );
    c.format(
        "zero_dimension",
        llama_patched(|w, l, b| put_u64(b, dim_at(w, l, "blk.0.attn_q.weight", 1), 0)),
        &["tensor 'blk.0.attn_q.weight' has dimension 1 = 0"],
    );
    c.format(
        "dimension_above_i64_max",
        llama_patched(|w, l, b| put_u64(b, dim_at(w, l, "blk.0.attn_q.weight", 0), 1 << 63)),
        &["tensor 'blk.0.attn_q.weight' has dimension 0 = 9223372036854775808"],
    );
    c.format(
        "dims_product_overflows_i64",
        llama_with(|w| w.tensor_mut("blk.0.attn_q.weight").dims = vec![32, 1 << 31, 1 << 31, 4]),
        &[
            "tensor 'blk.0.attn_q.weight'",
            "[32, 2147483648, 2147483648, 4] elements, which overflows",
        ],
    );
    c.format(
        "dims_product_just_above_i64_max",
        llama_with(|w| w.tensor_mut("blk.0.attn_q.weight").dims = vec![1 << 32, 1 << 31]),
        &["tensor 'blk.0.attn_q.weight'", "overflows"],
    );
    c.format(
        "q4_0_row_of_33_values",
        llama_with(|w| {
            let t = w.tensor_mut("blk.0.attn_norm.weight");
            t.type_id = tt::Q4_0;
            t.dims = vec![33, 1];
            t.data = vec![0; 36];
        }),
        &[
            "tensor 'blk.0.attn_norm.weight' has rows of 33 values",
            "32-value blocks of Q4_0",
        ],
    );
    let tensor_type = |id: u32| {
        llama_patched(|w, l, b| {
            put_u32(
                b,
                l.tensor_type_at[tensor_index(w, "blk.0.attn_k.weight")],
                id,
            )
        })
    };
    for id in [4, 5, 31, 40, 1000, u32::MAX] {
        let at = layout.tensor_type_at[tensor_index(&base_w, "blk.0.attn_k.weight")];
        c.format(
            &format!("unknown_tensor_type_{id}"),
            tensor_type(id),
            &[&format!(
                "tensor 'blk.0.attn_k.weight' has unknown tensor type id {id} at offset {at}"
            )],
        );
    }
    c.format(
        "tensor_name_of_64_bytes",
        llama_with(|w| w.tensor_mut("blk.0.attn_norm.weight").name = "n".repeat(64)),
        &["tensor 1 has a name of 64 bytes", "1..=63"],
    );
    c.format(
        "empty_tensor_name",
        llama_with(|w| w.tensor_mut("blk.0.attn_norm.weight").name.clear()),
        &["tensor 1 has a name of 0 bytes"],
    );
    c.format(
        "huge_tensor_name_length",
        llama_patched(|_, l, b| put_u64(b, l.tensor_info_at[0], u64::MAX)),
        &[
            "truncated",
            "the name of tensor 0 needs 18446744073709551615 bytes",
        ],
    );
    c.format(
        "invalid_utf8_in_tensor_name",
        llama_patched(|_, l, b| b[l.tensor_info_at[2] + 8 + 4] = 0x80),
        &["the name of tensor 2", "not valid UTF-8"],
    );
    c.format(
        "duplicate_tensor_name",
        llama_with(|w| {
            w.tensor_mut("blk.0.attn_norm.weight").name = "token_embd.weight".to_string()
        }),
        &[
            "duplicate tensor name 'token_embd.weight'",
            "tensor infos 0 and 1",
        ],
    );

    // --- Tensor offsets and the data section. -----------------------------
    let attn_norm_offset = get_u64(
        &base,
        offset_field_at(&base_w, &layout, "blk.0.attn_norm.weight"),
    );
    assert_eq!(attn_norm_offset, 2048, "token_embd.weight is 32 × 16 f32");
    c.format(
        "tensor_offset_not_aligned",
        llama_patched(|w, l, b| put_u64(b, offset_field_at(w, l, "blk.0.attn_norm.weight"), 2048 + 16)),
        &["tensor 'blk.0.attn_norm.weight' has data offset 2064, not a multiple of the alignment 32"],
    );
    c.format(
        "tensor_offset_past_end_of_file",
        llama_patched(|w, l, b| {
            put_u64(b, offset_field_at(w, l, "blk.0.attn_norm.weight"), 1 << 32)
        }),
        &[
            "tensor 'blk.0.attn_norm.weight'",
            "at data offset 4294967296",
            "extends past the end of the file",
        ],
    );
    c.format(
        "tensor_offset_plus_size_overflows_u64",
        llama_patched(|w, l, b| {
            put_u64(b, offset_field_at(w, l, "blk.0.attn_norm.weight"), !31u64)
        }),
        &[
            "tensor 'blk.0.attn_norm.weight'",
            "at data offset 18446744073709551584",
            "extends past the end of the file",
        ],
    );
    c.format(
        "tensors_overlap",
        llama_patched(|w, l, b| put_u64(b, offset_field_at(w, l, "blk.0.attn_norm.weight"), 1024)),
        &[
            "tensors 'token_embd.weight' and 'blk.0.attn_norm.weight' overlap",
            "data offsets 0 and 1024",
        ],
    );
    c.format(
        "two_tensors_at_the_same_offset",
        llama_patched(|w, l, b| {
            let at = get_u64(b, offset_field_at(w, l, "blk.1.ffn_up.weight"));
            put_u64(b, offset_field_at(w, l, "blk.1.ffn_gate.weight"), at);
        }),
        &[
            "'blk.1.ffn_gate.weight'",
            "'blk.1.ffn_up.weight'",
            "overlap",
        ],
    );
    {
        let last = &base_w.tensors[last_tensor];
        let last_offset =
            get_u64(&base, offset_field_at(&base_w, &layout, "output.weight")) as usize;
        assert_eq!(
            layout.data_at + last_offset + last.data.len(),
            base.len(),
            "output.weight ends the file"
        );
        c.format(
            "truncated_in_data_section",
            base[..layout.data_at + last_offset + last.data.len() / 2].to_vec(),
            &["tensor 'output.weight'", "extends past the end of the file"],
        );
        c.format(
            "truncated_by_one_byte",
            base[..base.len() - 1].to_vec(),
            &["tensor 'output.weight'", "extends past the end of the file"],
        );
        c.format(
            "truncated_at_data_section_start",
            base[..layout.data_at].to_vec(),
            &[
                "tensor 'token_embd.weight'",
                "extends past the end of the file",
                "data section holds 0 bytes",
            ],
        );
        let infos_end = layout.tensor_type_at[last_tensor] + 4 + 8;
        assert!(
            infos_end < layout.data_at,
            "the tiny llama needs padding before its data"
        );
        c.format(
            "truncated_in_padding_before_data",
            base[..infos_end].to_vec(),
            &[
                "truncated",
                &format!("the data section starts at offset {}", layout.data_at),
            ],
        );
    }

    // --- general.alignment. -----------------------------------------------
    let alignment = |m: Meta| llama_with(|w| w.set_kv("general.alignment", m));
    c.format(
        "alignment_48",
        alignment(Meta::U32(48)),
        &["'general.alignment' = 48 is not a power of two"],
    );
    c.format(
        "alignment_0",
        alignment(Meta::U32(0)),
        &["'general.alignment' = 0 is not a power of two"],
    );
    c.format(
        "alignment_as_string",
        alignment(Meta::str("32")),
        &["'general.alignment' has type string, expected u32"],
    );
    c.format(
        "alignment_as_u64",
        alignment(Meta::U64(32)),
        &["'general.alignment' has type u64, expected u32"],
    );
    c.format(
        "alignment_2_pow_31",
        alignment(Meta::U32(1 << 31)),
        &["tensor 'blk.0.attn_norm.weight' has data offset 2048, not a multiple of the alignment 2147483648"],
    );

    // --- Architecture and tokenizer. --------------------------------------
    c.format(
        "missing_general_architecture",
        llama_with(|w| w.remove_kv("general.architecture")),
        &["missing metadata key 'general.architecture'"],
    );
    c.format(
        "general_architecture_as_u32",
        llama_with(|w| w.set_kv("general.architecture", Meta::U32(1))),
        &["'general.architecture' has type u32, expected a string"],
    );
    c.unsupported(
        "unsupported_architecture_falcon",
        llama_with(|w| w.set_kv("general.architecture", Meta::str("falcon"))),
        &["architecture 'falcon' is not supported"],
    );
    c.format(
        "missing_tokenizer_tokens",
        llama_with(|w| w.remove_kv("tokenizer.ggml.tokens")),
        &["missing metadata key 'tokenizer.ggml.tokens'"],
    );
    c.format(
        "tokenizer_tokens_as_u32_array",
        llama_with(|w| {
            w.set_kv(
                "tokenizer.ggml.tokens",
                Meta::Array(vt::U32, vec![Meta::U32(1)]),
            )
        }),
        &["'tokenizer.ggml.tokens' has type array of u32, expected an array of string"],
    );
    c.format(
        "empty_tokenizer_tokens",
        llama_with(|w| w.set_kv("tokenizer.ggml.tokens", Meta::strings(&[]))),
        &["tokenizer.ggml.tokens holds 0 tokens"],
    );

    // --- Tensors the architecture needs. ----------------------------------
    c.format(
        "missing_required_tensor",
        llama_with(|w| w.remove_tensor("blk.1.ffn_down.weight")),
        &["tensor 'blk.1.ffn_down.weight' is missing", "llama"],
    );
    c.format(
        "missing_token_embd",
        llama_with(|w| w.remove_tensor("token_embd.weight")),
        &["tensor 'token_embd.weight' is missing"],
    );
    // attn_q is square in the tiny model (32 × 32), so attn_k is swapped.
    c.format(
        "tensor_with_swapped_dims",
        llama_with(|w| w.tensor_mut("blk.0.attn_k.weight").dims = vec![16, 32]),
        &["tensor 'blk.0.attn_k.weight' has shape [16, 32], expected [32, 16]"],
    );
    c.format(
        "tensor_with_an_extra_dimension",
        llama_with(|w| w.tensor_mut("output_norm.weight").dims = vec![32, 1]),
        &["tensor 'output_norm.weight' has shape [32, 1], expected [32]"],
    );
    c.format(
        "unexpected_extra_tensor",
        llama_with(|w| {
            let t = w.tensor_mut("blk.1.attn_norm.weight").clone();
            w.tensors.push(common::gguf_writer::Tensor {
                name: "blk.2.attn_norm.weight".into(),
                ..t
            });
        }),
        &["unexpected tensor 'blk.2.attn_norm.weight'", "2 layers"],
    );
    c.format(
        "qwen2_bias_in_a_llama_model",
        llama_with(|w| {
            let t = w.tensor_mut("blk.0.attn_norm.weight").clone();
            w.tensors.push(common::gguf_writer::Tensor {
                name: "blk.0.attn_q.bias".into(),
                ..t
            });
        }),
        &["unexpected tensor 'blk.0.attn_q.bias'"],
    );
    {
        // IQ2_XXS needs rows of 256: use a model whose ffn_down rows are 256 long.
        let mut w = tiny_model_with("llama", common::tiny_model::TinyShape { n_ff: 256, ..TINY });
        let t = w.tensor_mut("blk.0.ffn_down.weight");
        assert_eq!(t.dims, vec![256, 32]);
        t.type_id = tt::IQ2_XXS;
        t.data = vec![0; 32 * 66];
        c.unsupported(
            "unsupported_tensor_type_iq2_xxs",
            w.build(),
            &[
                "tensor 'blk.0.ffn_down.weight' has type IQ2_XXS",
                "does not compute with",
            ],
        );
    }

    // --- Hyper-parameters. -------------------------------------------------
    let kv = |key: &str, m: Meta| llama_with(|w| w.set_kv(key, m));
    c.format(
        "block_count_as_string",
        kv("llama.block_count", Meta::str("2")),
        &["metadata key 'llama.block_count' has type string, expected an integer"],
    );
    c.format(
        "rms_epsilon_as_u32",
        kv("llama.attention.layer_norm_rms_epsilon", Meta::U32(1)),
        &["metadata key 'llama.attention.layer_norm_rms_epsilon' has type u32, expected a float"],
    );
    c.format(
        "rms_epsilon_nan",
        kv(
            "llama.attention.layer_norm_rms_epsilon",
            Meta::F32(f32::NAN),
        ),
        &["metadata key 'llama.attention.layer_norm_rms_epsilon' = NaN is out of range"],
    );
    c.format(
        "block_count_zero",
        kv("llama.block_count", Meta::U32(0)),
        &["metadata key 'llama.block_count' = 0 is out of range"],
    );
    c.format(
        "block_count_negative",
        kv("llama.block_count", Meta::I32(-1)),
        &["metadata key 'llama.block_count' = -1 is out of range"],
    );
    c.format(
        "block_count_above_the_tensors",
        kv("llama.block_count", Meta::U32(3)),
        &["tensor 'blk.2.attn_norm.weight' is missing"],
    );
    c.format(
        "embedding_length_2_pow_30",
        kv("llama.embedding_length", Meta::U32(1 << 30)),
        &["metadata key 'llama.embedding_length' = 1073741824 is out of range"],
    );
    c.format(
        "head_count_zero",
        kv("llama.attention.head_count", Meta::U32(0)),
        &["metadata key 'llama.attention.head_count' = 0 is out of range"],
    );
    c.format(
        "head_count_kv_zero",
        kv("llama.attention.head_count_kv", Meta::U32(0)),
        &["metadata key 'llama.attention.head_count_kv' = 0 is out of range"],
    );
    c.format(
        "head_count_not_a_multiple_of_head_count_kv",
        llama_with(|w| {
            w.set_kv("llama.attention.head_count", Meta::U32(4));
            w.set_kv("llama.attention.head_count_kv", Meta::U32(3));
        }),
        &["llama.attention.head_count = 4 is not a multiple of llama.attention.head_count_kv = 3"],
    );
    c.format(
        "missing_context_length",
        llama_with(|w| w.remove_kv("llama.context_length")),
        &["missing metadata key 'llama.context_length'"],
    );
    c.format(
        "token_embd_vocab_not_matching_token_count",
        llama_with(|w| {
            let tokens: Vec<String> = (0..TINY.n_vocab - 1).map(|i| format!("tok{i}")).collect();
            let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
            w.set_kv("tokenizer.ggml.tokens", Meta::strings(&refs));
        }),
        &["tensor 'token_embd.weight' has shape [32, 16], expected [32, 15]"],
    );

    // --- Gemma 3. ------------------------------------------------------------
    let gemma_with = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = tiny_model("gemma3");
        f(&mut w);
        w.build()
    };
    c.format(
        "gemma3_missing_q_norm",
        gemma_with(&|w| w.remove_tensor("blk.1.attn_q_norm.weight")),
        &["tensor 'blk.1.attn_q_norm.weight' is missing", "gemma3"],
    );
    c.format(
        "gemma3_sliding_window_zero",
        gemma_with(&|w| w.set_kv("gemma3.attention.sliding_window", Meta::U32(0))),
        &["metadata key 'gemma3.attention.sliding_window' = 0 is out of range"],
    );
    c.format(
        "gemma3_odd_key_length",
        gemma_with(&|w| w.set_kv("gemma3.attention.key_length", Meta::U32(7))),
        &["attention head size 7", "even"],
    );
    c.format(
        "gemma3_with_an_output_norm_of_wrong_length",
        gemma_with(&|w| {
            let t = w.tensor_mut("output_norm.weight");
            t.dims = vec![16];
            t.data.truncate(64);
        }),
        &["tensor 'output_norm.weight' has shape [16], expected [32]"],
    );
    // --- Mixtures of experts: the router and the 3-D expert tensors replace
    // the dense FFN, with the expert counts the metadata says.
    let moe_with = |arch: &str, f: &dyn Fn(&mut GgufWriter)| {
        let mut w = tiny_model(arch);
        f(&mut w);
        w.build()
    };
    c.format(
        "llama_moe_missing_router",
        moe_with("llama-moe", &|w| {
            w.remove_tensor("blk.0.ffn_gate_inp.weight")
        }),
        &["tensor 'blk.0.ffn_gate_inp.weight' is missing", "llama"],
    );
    c.format(
        "llama_moe_with_a_dense_ffn_too",
        moe_with("llama-moe", &|w| w.remove_kv("llama.expert_count")),
        &["tensor 'blk.0.ffn_gate.weight' is missing"],
    );
    c.format(
        "llama_moe_using_more_experts_than_it_has",
        moe_with("llama-moe", &|w| {
            w.set_kv("llama.expert_used_count", Meta::U32(5))
        }),
        &["metadata key 'llama.expert_used_count' = 5 is out of range (1..=4)"],
    );
    c.format(
        "qwen3moe_without_experts",
        moe_with("qwen3moe", &|w| w.remove_kv("qwen3moe.expert_count")),
        &["qwen3moe.expert_count"],
    );
    c.format(
        "qwen3moe_expert_tensor_of_wrong_expert_count",
        moe_with("qwen3moe", &|w| {
            w.set_kv("qwen3moe.expert_count", Meta::U32(3))
        }),
        &["tensor 'blk.0.ffn_gate_inp.weight' has shape [32, 4], expected [32, 3]"],
    );
    // --- gpt-oss: sinks, biases and a window are part of the architecture;
    // YaRN is taken for gpt-oss alone.
    c.format(
        "gpt_oss_missing_attention_sinks",
        moe_with("gpt-oss", &|w| w.remove_tensor("blk.1.attn_sinks.weight")),
        &["tensor 'blk.1.attn_sinks.weight' is missing", "gpt-oss"],
    );
    c.format(
        "gpt_oss_expert_bias_of_wrong_expert_count",
        moe_with("gpt-oss", &|w| {
            let t = w.tensor_mut("blk.0.ffn_down_exps.bias");
            t.dims = vec![32, 3];
            t.data.truncate(32 * 3 * 4);
        }),
        &["tensor 'blk.0.ffn_down_exps.bias' has shape [32, 3], expected [32, 4]"],
    );
    c.format(
        "gpt_oss_without_a_sliding_window",
        moe_with("gpt-oss", &|w| {
            w.remove_kv("gpt-oss.attention.sliding_window")
        }),
        &["gpt-oss.attention.sliding_window"],
    );
    // --- Gemma 4: per-layer KV heads and window flags, the sliding-window
    // layers' own head widths, the full-attention layers' RoPE factors; its
    // E2B/E4B and MoE features are refused by name.
    let gemma4_with = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = tiny_model("gemma4");
        f(&mut w);
        w.build()
    };
    c.format(
        "gemma4_full_layers_without_rope_factors",
        gemma4_with(&|w| w.remove_tensor("rope_freqs.weight")),
        &["tensor 'rope_freqs.weight' is missing", "gemma4"],
    );
    c.format(
        "gemma4_kv_heads_for_fewer_layers",
        gemma4_with(&|w| {
            w.set_kv(
                "gemma4.attention.head_count_kv",
                Meta::Array(vt::I32, vec![Meta::I32(2)]),
            )
        }),
        &["gemma4.attention.head_count_kv", "must hold 2 values"],
    );
    c.format(
        "gemma4_without_window_flags",
        gemma4_with(&|w| w.remove_kv("gemma4.attention.sliding_window_pattern")),
        &["gemma4.attention.sliding_window_pattern"],
    );
    c.format(
        "gemma4_sliding_values_wider_than_keys",
        gemma4_with(&|w| w.set_kv("gemma4.attention.value_length_swa", Meta::U32(16))),
        &["keys and values must be equally wide"],
    );
    c.format(
        "gemma4_value_projection_of_the_full_layers_width",
        gemma4_with(&|w| {
            let t = w.tensor_mut("blk.0.attn_v.weight");
            t.dims = vec![32, 32];
            t.data.resize(32 * 32 * 4, 0);
        }),
        &["tensor 'blk.0.attn_v.weight' has shape [32, 32], expected [32, 16]"],
    );
    c.format(
        "gemma4_sliding_layers_rotating_more_than_their_heads",
        gemma4_with(&|w| w.remove_kv("gemma4.rope.dimension_count_swa")),
        &["gemma4.rope.dimension_count_swa = 32", "head size 8"],
    );
    c.unsupported(
        "gemma4_with_per_layer_input_embeddings",
        gemma4_with(&|w| w.set_kv("gemma4.embedding_length_per_layer_input", Meta::U32(8))),
        &["per-layer input embeddings are not supported"],
    );
    c.unsupported(
        "gemma4_with_layers_sharing_kv_caches",
        gemma4_with(&|w| w.set_kv("gemma4.attention.shared_kv_layers", Meta::U32(1))),
        &["reuse another layer's KV cache"],
    );
    c.unsupported(
        "yarn_rope_scaling_on_llama",
        llama_with(|w| w.set_kv("llama.rope.scaling.type", Meta::str("yarn"))),
        &["llama.rope.scaling.type", "'yarn' is not supported"],
    );
    {
        let w = tiny_model("gemma3");
        let (b, l) = w.build_with_layout();
        c.format(
            "gemma3_truncated_in_data_section",
            b[..(l.data_at + b.len()) / 2].to_vec(),
            &["extends past the end of the file"],
        );
    }

    // --- Special token ids: one outside the vocabulary is rejected, not
    // replaced by a default (llama.cpp warns and keeps its default).
    c.format(
        "bos_token_id_one_past_the_vocabulary",
        llama_with(|w| w.set_kv("tokenizer.ggml.bos_token_id", Meta::U32(16))),
        &["metadata key 'tokenizer.ggml.bos_token_id' = 16 is outside the vocabulary of 16 tokens"],
    );
    c.format(
        "eos_token_id_far_past_the_vocabulary",
        llama_with(|w| w.set_kv("tokenizer.ggml.eos_token_id", Meta::U32(u32::MAX))),
        &["'tokenizer.ggml.eos_token_id' = 4294967295 is outside the vocabulary"],
    );
    c.format(
        "padding_token_id_past_the_vocabulary",
        llama_with(|w| w.set_kv("tokenizer.ggml.padding_token_id", Meta::U32(100))),
        &["'tokenizer.ggml.padding_token_id' = 100"],
    );

    c.0
}

/// Checks one case through every path; the problems found, if any.
fn check_case(case: &Case) -> Vec<String> {
    let mut problems = Vec::new();
    for (how, outcome) in load_every_way(&case.name, &case.bytes) {
        match outcome {
            Outcome::Loaded => {
                problems.push(format!("{how}: loaded, expected {:?} error", case.kind))
            }
            Outcome::Panicked(msg) => problems.push(format!("{how}: PANICKED: {msg}")),
            Outcome::Failed(e) => {
                if e.kind() != case.kind {
                    problems.push(format!(
                        "{how}: kind {:?}, expected {:?}: {e}",
                        e.kind(),
                        case.kind
                    ));
                }
                let missing: Vec<&String> = case
                    .words
                    .iter()
                    .filter(|w| !e.message().contains(w.as_str()))
                    .collect();
                if !missing.is_empty() {
                    problems.push(format!("{how}: message lacks {missing:?}: {e}"));
                }
                if how.starts_with("Model::load") && !e.message().contains("malformed-") {
                    problems.push(format!("{how}: message does not name the file: {e}"));
                }
            }
        }
    }
    problems
}

#[test]
fn the_unmodified_tiny_models_load_every_way() {
    // Every case is one change away from these; they must load.
    for arch in ["llama", "gemma3", "gemma4"] {
        for (how, outcome) in load_every_way(&format!("valid-{arch}"), &tiny_model(arch).build()) {
            match outcome {
                Outcome::Loaded => {}
                Outcome::Failed(e) => panic!("{arch} {how}: {e}"),
                Outcome::Panicked(msg) => panic!("{arch} {how}: panicked: {msg}"),
            }
        }
    }
}

#[test]
fn the_corpus_has_at_least_30_distinct_cases() {
    let cases = corpus();
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "case names must be unique");
    assert!(n >= 30, "only {n} cases");
    for case in &cases {
        assert!(!case.words.is_empty(), "{}: no expected words", case.name);
    }
}

#[test]
fn every_malformed_file_fails_with_the_expected_kind_and_reason() {
    let cases = corpus();
    let mut failures = Vec::new();
    for case in &cases {
        let started = Instant::now();
        for problem in check_case(case) {
            failures.push(format!("[{}] {problem}", case.name));
        }
        // Hostile counts and lengths must be rejected without allocating or
        // reading for them.
        let took = started.elapsed();
        if took > Duration::from_secs(2) {
            failures.push(format!("[{}] took {took:?}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Files that are not there, and files that are not files
// ---------------------------------------------------------------------------

#[test]
fn a_missing_file_is_an_io_error_naming_the_path() {
    let path = common::scratch_path("does-not-exist.gguf");
    let _ = std::fs::remove_file(&path);
    for use_mmap in [true, false] {
        let Err(e) = Model::load(&path, load_options(use_mmap)) else {
            panic!("a missing file loaded")
        };
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(e.message().contains(&path.display().to_string()), "{e}");
    }
}

#[test]
fn a_directory_is_an_io_error_naming_the_path() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    for use_mmap in [true, false] {
        let Err(e) = Model::load(dir, load_options(use_mmap)) else {
            panic!("a directory loaded")
        };
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(e.message().contains(&dir.display().to_string()), "{e}");
    }
}

#[test]
fn an_empty_file_is_a_format_error() {
    let Err(e) = load_from_bytes(&[]) else {
        panic!("empty bytes loaded")
    };
    assert_eq!(e.kind(), ErrorKind::Format, "{e}");
    assert!(e.message().contains("truncated at offset 0"), "{e}");
    let path = common::scratch_path("empty.gguf");
    std::fs::write(&path, []).unwrap();
    for use_mmap in [true, false] {
        let Err(e) = Model::load(&path, load_options(use_mmap)) else {
            panic!("an empty file loaded")
        };
        assert_eq!(e.kind(), ErrorKind::Format, "{e}");
        assert!(
            e.message().contains("empty") && e.message().contains(&path.display().to_string()),
            "{e}"
        );
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_header_only_file_reports_bad_data_offsets_without_loading_data() {
    // vocab_only reads no tensor data, but the header checks still apply.
    let bytes =
        llama_patched(|w, l, b| put_u64(b, offset_field_at(w, l, "output.weight"), 1 << 40));
    let path = common::scratch_path("vocab-only-bad-offset.gguf");
    std::fs::write(&path, &bytes).unwrap();
    for use_mmap in [true, false] {
        let options = LoadOptions {
            vocab_only: true,
            ..load_options(use_mmap)
        };
        let Err(e) = Model::load(&path, options) else {
            panic!("loaded")
        };
        assert_eq!(e.kind(), ErrorKind::Format, "{e}");
        assert!(
            e.message().contains("'output.weight'")
                && e.message().contains("past the end of the file"),
            "{e}"
        );
    }
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------
// Random corruption
// ---------------------------------------------------------------------------

/// xorshift64: deterministic, no crates.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One seeded corruption of `valid`: its bytes and what was done.
fn mutate(valid: &[u8], header_len: usize, seed: u64) -> (Vec<u8>, String) {
    let mut rng = Rng::new(seed);
    let mut b = valid.to_vec();
    let what = match rng.below(5) {
        0 => {
            let n = 1 + rng.below(4);
            let mut flips = Vec::new();
            for _ in 0..n {
                let at = rng.below(header_len);
                let mask = 1 + rng.below(255) as u8;
                b[at] ^= mask;
                flips.push((at, mask));
            }
            format!("xor (offset, mask) {flips:?}")
        }
        1 => {
            let at = rng.below(header_len - 8);
            b[at..at + 8].fill(0xFF);
            format!("0xFF x 8 at {at}")
        }
        2 => {
            let at = rng.below(header_len - 8);
            let v = rng.next_u64();
            put_u64(&mut b, at, v);
            format!("u64 {v:#x} at {at}")
        }
        3 => {
            // A small integer: plausible counts, lengths, type ids and dims.
            let at = rng.below(header_len - 8);
            let v = rng.next_u64() % 300;
            put_u64(&mut b, at, v);
            format!("u64 {v} at {at}")
        }
        _ => {
            let len = rng.below(valid.len());
            b.truncate(len);
            format!("truncated to {len} bytes")
        }
    };
    (b, what)
}

#[test]
fn random_corruptions_never_panic() {
    const MUTATIONS: u64 = 10_000;
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for arch in ["llama", "gemma3"] {
        let (valid, layout) = tiny_model(arch).build_with_layout();
        for seed in 0..MUTATIONS {
            let (bytes, what) = mutate(&valid, layout.data_at, seed);
            // A model that loads must also give the bytes of every tensor.
            let in_memory = run(|| {
                let model = load_from_bytes(&bytes)?;
                let gguf = model.gguf();
                for t in gguf.tensors() {
                    assert!(
                        gguf.tensor_bytes(t).is_some(),
                        "no bytes for tensor '{}'",
                        t.name
                    );
                }
                let _ = model.describe_json();
                Ok(model)
            });
            let mut outcomes = vec![("from_bytes + Model::from_gguf".to_string(), in_memory)];
            // Every 100th mutation also goes through the file paths.
            if seed % 100 == 0 {
                outcomes.extend(
                    load_every_way(&format!("mutation-{arch}-{seed}"), &bytes)
                        .into_iter()
                        .skip(1),
                );
            }
            for (how, outcome) in outcomes {
                let label = match outcome {
                    Outcome::Loaded => "ok".to_string(),
                    Outcome::Failed(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::Format | ErrorKind::Unsupported | ErrorKind::OutOfMemory
                        ) =>
                    {
                        format!("{:?}", e.kind())
                    }
                    Outcome::Failed(e) => {
                        failures.push(format!(
                            "{arch} seed {seed} ({what}), {how}: unexpected kind {:?}: {e}",
                            e.kind()
                        ));
                        "bad kind".to_string()
                    }
                    Outcome::Panicked(msg) => {
                        failures.push(format!(
                            "{arch} seed {seed} ({what}), {how}: PANICKED: {msg}"
                        ));
                        "panic".to_string()
                    }
                };
                *tally.entry(label).or_default() += 1;
            }
        }
    }
    eprintln!("outcomes: {tally:?} in {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} corruptions failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The mutations must actually exercise the error paths.
    assert!(
        tally.get("Format").copied().unwrap_or(0) > (MUTATIONS as usize),
        "{tally:?}"
    );
}
