//! The GGUF reader on valid files: every metadata value type, alignment,
//! tensor infos and tensor bytes, and the three ways of opening a file.
//!
//! Files are made with the independent test writer (`common::gguf_writer`).

mod common;

use common::gguf_writer::{f32_bytes, tt, vt, GgufWriter, Meta, KV_COUNT_AT, TENSOR_COUNT_AT};
use m40llm::gguf::{
    Array, GgufFile, ReadOptions, Value, ValueType, DEFAULT_ALIGNMENT, MAX_ARRAY_NESTING,
};
use m40llm::quant::GgmlType;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The value the reader should produce for a (non-raw) writer value.
fn expected_value(meta: &Meta) -> Value {
    match meta {
        Meta::U8(v) => Value::U8(*v),
        Meta::I8(v) => Value::I8(*v),
        Meta::U16(v) => Value::U16(*v),
        Meta::I16(v) => Value::I16(*v),
        Meta::U32(v) => Value::U32(*v),
        Meta::I32(v) => Value::I32(*v),
        Meta::F32(v) => Value::F32(*v),
        Meta::Bool(v) => Value::Bool(*v),
        Meta::Str(s) => Value::String(s.clone()),
        Meta::Array(elem, items) => Value::Array(expected_array(*elem, items)),
        Meta::U64(v) => Value::U64(*v),
        Meta::I64(v) => Value::I64(*v),
        Meta::F64(v) => Value::F64(*v),
        Meta::Raw(..) => panic!("raw values have no expected value"),
    }
}

fn expected_array(elem: u32, items: &[Meta]) -> Array {
    fn each<T>(items: &[Meta], f: impl Fn(&Meta) -> Option<T>) -> Vec<T> {
        items
            .iter()
            .map(|m| f(m).unwrap_or_else(|| panic!("array element {m:?} has the wrong type")))
            .collect()
    }
    match elem {
        vt::U8 => Array::U8(each(items, |m| {
            if let Meta::U8(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::I8 => Array::I8(each(items, |m| {
            if let Meta::I8(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::U16 => Array::U16(each(items, |m| {
            if let Meta::U16(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::I16 => Array::I16(each(items, |m| {
            if let Meta::I16(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::U32 => Array::U32(each(items, |m| {
            if let Meta::U32(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::I32 => Array::I32(each(items, |m| {
            if let Meta::I32(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::F32 => Array::F32(each(items, |m| {
            if let Meta::F32(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::BOOL => Array::Bool(each(items, |m| {
            if let Meta::Bool(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::STRING => Array::String(each(items, |m| {
            if let Meta::Str(v) = m {
                Some(v.clone())
            } else {
                None
            }
        })),
        vt::ARRAY => Array::Array(each(items, |m| {
            if let Meta::Array(e, i) = m {
                Some(expected_array(*e, i))
            } else {
                None
            }
        })),
        vt::U64 => Array::U64(each(items, |m| {
            if let Meta::U64(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::I64 => Array::I64(each(items, |m| {
            if let Meta::I64(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        vt::F64 => Array::F64(each(items, |m| {
            if let Meta::F64(v) = m {
                Some(*v)
            } else {
                None
            }
        })),
        other => panic!("unknown element type {other}"),
    }
}

/// Equality with floats compared by their bits (so NaN payloads and -0.0 count).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => same_array(x, y),
        _ => a == b,
    }
}

fn same_array(a: &Array, b: &Array) -> bool {
    match (a, b) {
        (Array::F32(x), Array::F32(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (Array::F64(x), Array::F64(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        }
        (Array::Array(x), Array::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_array(p, q))
        }
        _ => a == b,
    }
}

fn all_read_options() -> [ReadOptions; 4] {
    [
        ReadOptions {
            use_mmap: true,
            load_data: true,
        },
        ReadOptions {
            use_mmap: false,
            load_data: true,
        },
        ReadOptions {
            use_mmap: true,
            load_data: false,
        },
        ReadOptions {
            use_mmap: false,
            load_data: false,
        },
    ]
}

fn write_scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = common::scratch_path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A metadata value of every type, with extreme values, arrays of every
/// element type, empty arrays and nested arrays.
fn every_kind_of_value() -> Vec<(String, Meta)> {
    let mut kvs: Vec<(String, Meta)> = Vec::new();
    let mut add = |key: &str, m: Meta| kvs.push((key.to_string(), m));

    add("u8.min", Meta::U8(u8::MIN));
    add("u8.max", Meta::U8(u8::MAX));
    add("i8.min", Meta::I8(i8::MIN));
    add("i8.max", Meta::I8(i8::MAX));
    add("i8.minus_one", Meta::I8(-1));
    add("u16.min", Meta::U16(u16::MIN));
    add("u16.max", Meta::U16(u16::MAX));
    add("i16.min", Meta::I16(i16::MIN));
    add("i16.max", Meta::I16(i16::MAX));
    add("u32.min", Meta::U32(u32::MIN));
    add("u32.max", Meta::U32(u32::MAX));
    add("i32.min", Meta::I32(i32::MIN));
    add("i32.max", Meta::I32(i32::MAX));
    add("u64.min", Meta::U64(u64::MIN));
    add("u64.max", Meta::U64(u64::MAX));
    add("i64.min", Meta::I64(i64::MIN));
    add("i64.max", Meta::I64(i64::MAX));
    let f32s = [
        0.0,
        -0.0,
        1.5,
        f32::MIN,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::EPSILON,
        f32::from_bits(1), // smallest subnormal
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7fc0_1234), // quiet NaN with a payload
        f32::from_bits(0xffc0_0001), // negative NaN
        f32::from_bits(0x7f80_0001), // signalling NaN
    ];
    for (i, v) in f32s.iter().enumerate() {
        add(&format!("f32.{i}"), Meta::F32(*v));
    }
    let f64s = [
        0.0,
        -0.0,
        -2.25,
        f64::MIN,
        f64::MAX,
        f64::MIN_POSITIVE,
        f64::EPSILON,
        f64::from_bits(1),
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::from_bits(0x7ff8_0000_dead_beef),
        f64::from_bits(0xfff8_0000_0000_0001),
        f64::from_bits(0x7ff0_0000_0000_0001),
    ];
    for (i, v) in f64s.iter().enumerate() {
        add(&format!("f64.{i}"), Meta::F64(*v));
    }
    add("bool.false", Meta::Bool(false));
    add("bool.true", Meta::Bool(true));
    add("string.empty", Meta::str(""));
    add("string.ascii", Meta::str("hello, world"));
    add(
        "string.utf8",
        Meta::str("héllo wörld ✓ 日本語 🦀 \u{10FFFF}"),
    );
    add("string.nul_and_controls", Meta::str("a\0b\n\t\u{7f}"));
    add("string.long", Meta::Str("x🦀".repeat(5000)));
    add("ключ.日本.🦀", Meta::str("a non-ASCII key"));

    // Arrays of every element type, and an empty array of each.
    add(
        "array.u8",
        Meta::Array(vt::U8, vec![Meta::U8(0), Meta::U8(1), Meta::U8(u8::MAX)]),
    );
    add(
        "array.i8",
        Meta::Array(
            vt::I8,
            vec![Meta::I8(i8::MIN), Meta::I8(0), Meta::I8(i8::MAX)],
        ),
    );
    add(
        "array.u16",
        Meta::Array(vt::U16, vec![Meta::U16(0), Meta::U16(u16::MAX)]),
    );
    add(
        "array.i16",
        Meta::Array(vt::I16, vec![Meta::I16(i16::MIN), Meta::I16(i16::MAX)]),
    );
    add(
        "array.u32",
        Meta::Array(
            vt::U32,
            vec![Meta::U32(0), Meta::U32(7), Meta::U32(u32::MAX)],
        ),
    );
    add(
        "array.i32",
        Meta::Array(
            vt::I32,
            vec![Meta::I32(i32::MIN), Meta::I32(-1), Meta::I32(i32::MAX)],
        ),
    );
    add(
        "array.f32",
        Meta::Array(vt::F32, f32s.iter().map(|v| Meta::F32(*v)).collect()),
    );
    add(
        "array.bool",
        Meta::Array(
            vt::BOOL,
            vec![Meta::Bool(true), Meta::Bool(false), Meta::Bool(true)],
        ),
    );
    add(
        "array.string",
        Meta::strings(&["", "a", "é🦀", "tok with spaces"]),
    );
    add(
        "array.u64",
        Meta::Array(vt::U64, vec![Meta::U64(0), Meta::U64(u64::MAX)]),
    );
    add(
        "array.i64",
        Meta::Array(vt::I64, vec![Meta::I64(i64::MIN), Meta::I64(i64::MAX)]),
    );
    add(
        "array.f64",
        Meta::Array(vt::F64, f64s.iter().map(|v| Meta::F64(*v)).collect()),
    );
    for elem in [
        vt::U8,
        vt::I8,
        vt::U16,
        vt::I16,
        vt::U32,
        vt::I32,
        vt::F32,
        vt::BOOL,
        vt::STRING,
        vt::ARRAY,
        vt::U64,
        vt::I64,
        vt::F64,
    ] {
        add(&format!("array.empty.{elem}"), Meta::Array(elem, vec![]));
    }
    // Arrays of arrays of strings (with an empty inner array).
    add(
        "array.of_arrays_of_strings",
        Meta::Array(
            vt::ARRAY,
            vec![
                Meta::strings(&["a", "b"]),
                Meta::strings(&[]),
                Meta::strings(&["ç", ""]),
            ],
        ),
    );
    // Arrays of arrays of arrays, inner arrays of different element types.
    add(
        "array.of_arrays_of_arrays",
        Meta::Array(
            vt::ARRAY,
            vec![
                Meta::Array(vt::ARRAY, vec![Meta::Array(vt::U32, vec![Meta::U32(1)])]),
                Meta::Array(vt::ARRAY, vec![]),
                Meta::Array(
                    vt::ARRAY,
                    vec![
                        Meta::Array(vt::U32, vec![]),
                        Meta::Array(vt::U32, vec![Meta::U32(2), Meta::U32(3)]),
                        Meta::Array(vt::F64, vec![Meta::F64(f64::NAN)]),
                        Meta::strings(&["deep"]),
                    ],
                ),
            ],
        ),
    );
    kvs
}

/// Arrays nested exactly `levels` deep, the innermost holding one u8.
fn nested_array(levels: u32) -> Meta {
    let mut m = Meta::Array(vt::U8, vec![Meta::U8(42)]);
    for _ in 1..levels {
        m = Meta::Array(vt::ARRAY, vec![m]);
    }
    m
}

fn check_metadata_round_trips(gguf: &GgufFile, kvs: &[(String, Meta)], context: &str) {
    let read: Vec<_> = gguf.metadata().collect();
    assert_eq!(read.len(), kvs.len(), "{context}: metadata entry count");
    for ((key, meta), entry) in kvs.iter().zip(&read) {
        assert_eq!(entry.key, key, "{context}: metadata is in file order");
        let expected = expected_value(meta);
        assert!(
            same_value(entry.value, &expected),
            "{context}: key {key}: read {:?}, wrote {expected:?}",
            entry.value
        );
        assert_eq!(
            entry.value.value_type().id(),
            meta.type_id(),
            "{context}: key {key}: type id"
        );
        assert_eq!(
            ValueType::from_id(meta.type_id()),
            Some(entry.value.value_type()),
            "{context}: key {key}"
        );
        let by_key = gguf
            .get(key)
            .unwrap_or_else(|| panic!("{context}: get({key}) found nothing"));
        assert!(same_value(by_key.value, &expected), "{context}: get({key})");
    }
}

// ---------------------------------------------------------------------------
// Metadata values
// ---------------------------------------------------------------------------

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    let kvs = every_kind_of_value();
    // Every one of the 13 value types is written at least once, and as an
    // array element type at least once.
    for id in 0..13 {
        assert!(
            kvs.iter().any(|(_, m)| m.type_id() == id),
            "value type {id} is not covered"
        );
        assert!(
            kvs.iter()
                .any(|(_, m)| matches!(m, Meta::Array(e, items) if *e == id && !items.is_empty())),
            "array element type {id} is not covered"
        );
    }
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version = version;
        w.kvs = kvs.clone();
        w = w.tensor("t", &[4], tt::F32, f32_bytes(4, 1));
        let bytes = w.build();
        let gguf = GgufFile::from_bytes(&bytes).unwrap_or_else(|e| panic!("v{version}: {e}"));
        assert_eq!(gguf.version(), version);
        check_metadata_round_trips(&gguf, &kvs, &format!("v{version} from_bytes"));

        let path = write_scratch(&format!("every-value-v{version}.gguf"), &bytes);
        for options in all_read_options() {
            let gguf = GgufFile::open(&path, options)
                .unwrap_or_else(|e| panic!("v{version} {options:?}: {e}"));
            assert_eq!(gguf.version(), version);
            check_metadata_round_trips(&gguf, &kvs, &format!("v{version} open {options:?}"));
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn value_types_have_the_spec_ids_names_and_minimum_sizes() {
    let table = [
        (ValueType::U8, vt::U8, "u8", 1),
        (ValueType::I8, vt::I8, "i8", 1),
        (ValueType::U16, vt::U16, "u16", 2),
        (ValueType::I16, vt::I16, "i16", 2),
        (ValueType::U32, vt::U32, "u32", 4),
        (ValueType::I32, vt::I32, "i32", 4),
        (ValueType::F32, vt::F32, "f32", 4),
        (ValueType::Bool, vt::BOOL, "bool", 1),
        (ValueType::String, vt::STRING, "string", 8),
        (ValueType::Array, vt::ARRAY, "array", 12),
        (ValueType::U64, vt::U64, "u64", 8),
        (ValueType::I64, vt::I64, "i64", 8),
        (ValueType::F64, vt::F64, "f64", 8),
    ];
    for (ty, id, name, min) in table {
        assert_eq!(ty.id(), id);
        assert_eq!(ValueType::from_id(id), Some(ty));
        assert_eq!(ty.name(), name);
        assert_eq!(ty.min_encoded_bytes(), min);
    }
    for bad in [13, 14, 255, u32::MAX] {
        assert_eq!(ValueType::from_id(bad), None);
    }
}

#[test]
fn typed_accessors_return_values_and_name_the_key_on_type_errors() {
    let bytes = GgufWriter::new()
        .kv("a.u8", Meta::U8(200))
        .kv("a.i64", Meta::I64(-5))
        .kv("a.f32", Meta::F32(0.25))
        .kv("a.f64", Meta::F64(1e300))
        .kv("a.str", Meta::str("s"))
        .kv("a.bool", Meta::Bool(true))
        .kv("a.tokens", Meta::strings(&["x", "y"]))
        .kv("a.ints", Meta::Array(vt::I32, vec![Meta::I32(1)]))
        .build();
    let g = GgufFile::from_bytes(&bytes).unwrap();
    assert_eq!(g.require("a.u8").unwrap().u32_in(0..=255).unwrap(), 200);
    let err = g.require("a.u8").unwrap().u32_in(0..=100).unwrap_err();
    assert!(
        err.message().contains("a.u8") && err.message().contains("out of range"),
        "{err}"
    );
    let err = g.require("a.i64").unwrap().u32_in(0..=10).unwrap_err();
    assert!(
        err.message().contains("a.i64") && err.message().contains("-5"),
        "{err}"
    );
    assert_eq!(g.require("a.f32").unwrap().f32_in(0.0..=1.0).unwrap(), 0.25);
    assert!(
        g.require("a.f64").unwrap().f32_in(0.0..=f32::MAX).is_err(),
        "1e300 does not fit an f32"
    );
    assert_eq!(g.require("a.str").unwrap().str().unwrap(), "s");
    assert!(g.require("a.bool").unwrap().bool().unwrap());
    assert_eq!(
        g.require("a.tokens").unwrap().string_array().unwrap(),
        ["x", "y"]
    );
    assert_eq!(
        g.require("a.ints").unwrap().array().unwrap(),
        &Array::I32(vec![1])
    );
    let err = g.require("a.ints").unwrap().string_array().unwrap_err();
    assert!(
        err.message().contains("'a.ints'") && err.message().contains("array of i32"),
        "{err}"
    );
    let err = g.require("a.str").unwrap().u32_in(0..=1).unwrap_err();
    assert!(err.message().contains("'a.str' has type string"), "{err}");
    let Err(err) = g.require("a.missing") else {
        panic!("a.missing was found")
    };
    assert_eq!(err.kind(), m40llm::error::ErrorKind::Format);
    assert!(err.message().contains("'a.missing'"), "{err}");
    assert!(g.get("a.missing").is_none());
}

#[test]
fn arrays_nested_exactly_max_array_nesting_levels_parse() {
    let meta = nested_array(MAX_ARRAY_NESTING);
    let bytes = GgufWriter::new().kv("nested", meta.clone()).build();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    let value = gguf.get("nested").unwrap().value;
    assert!(same_value(value, &expected_value(&meta)));
    // Walk down: MAX_ARRAY_NESTING - 1 arrays of arrays, then the u8 array.
    let Value::Array(array) = value else {
        panic!("not an array: {value:?}")
    };
    let mut array: &Array = array;
    for _ in 1..MAX_ARRAY_NESTING {
        match array {
            Array::Array(inner) if inner.len() == 1 => array = &inner[0],
            other => panic!("expected an array of one array, got {other:?}"),
        }
    }
    assert_eq!(array, &Array::U8(vec![42]));
}

#[test]
fn header_counts_are_what_the_file_declares() {
    let (bytes, _) = GgufWriter::new()
        .kv("a", Meta::U8(1))
        .kv("b", Meta::U8(2))
        .tensor("x", &[8], tt::F32, f32_bytes(8, 3))
        .build_with_layout();
    assert_eq!(
        u64::from_le_bytes(
            bytes[TENSOR_COUNT_AT..TENSOR_COUNT_AT + 8]
                .try_into()
                .unwrap()
        ),
        1
    );
    assert_eq!(
        u64::from_le_bytes(bytes[KV_COUNT_AT..KV_COUNT_AT + 8].try_into().unwrap()),
        2
    );
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    assert_eq!(gguf.metadata().count(), 2);
    assert_eq!(gguf.tensors().len(), 1);
    assert_eq!(gguf.file_size(), bytes.len() as u64);
}

// ---------------------------------------------------------------------------
// Alignment
// ---------------------------------------------------------------------------

/// Tensors of awkward sizes, so that each needs padding to the next boundary.
fn odd_sized_tensors(w: GgufWriter) -> GgufWriter {
    w.tensor("a", &[3], tt::F32, f32_bytes(3, 1))
        .tensor("b", &[5, 7], tt::F32, f32_bytes(35, 2))
        .tensor("c", &[9], tt::F16, (0..18u8).collect())
        .tensor(
            "d",
            &[32, 1],
            tt::Q8_0,
            (0..34u8).map(|b| b.wrapping_mul(7)).collect(),
        )
        .tensor("e", &[1], tt::F32, f32_bytes(1, 5))
}

#[test]
fn general_alignment_is_honoured_for_the_data_section_and_every_tensor() {
    for alignment in [1u64, 8, 64, 256, 4096] {
        let mut w = GgufWriter::new()
            .kv("general.name", Meta::str("aligned"))
            .kv("general.alignment", Meta::U32(alignment as u32));
        w.alignment = alignment;
        let w = odd_sized_tensors(w);
        let (bytes, layout) = w.build_with_layout();
        let path = write_scratch(&format!("aligned-{alignment}.gguf"), &bytes);
        let mut files = vec![(
            "from_bytes".to_string(),
            GgufFile::from_bytes(&bytes).unwrap(),
        )];
        for options in all_read_options().into_iter().filter(|o| o.load_data) {
            files.push((
                format!("{options:?}"),
                GgufFile::open(&path, options).unwrap(),
            ));
        }
        for (how, gguf) in &files {
            let ctx = format!("alignment {alignment}, {how}");
            assert_eq!(gguf.alignment(), alignment, "{ctx}");
            assert_eq!(gguf.data_offset() % alignment, 0, "{ctx}");
            assert_eq!(gguf.data_offset(), layout.data_at as u64, "{ctx}");
            assert_eq!(gguf.tensors().len(), w.tensors.len(), "{ctx}");
            for (info, written) in gguf.tensors().iter().zip(&w.tensors) {
                assert_eq!(info.offset % alignment, 0, "{ctx}: tensor {}", info.name);
                assert_eq!(
                    gguf.tensor_bytes(info).unwrap(),
                    &written.data[..],
                    "{ctx}: tensor {}",
                    info.name
                );
                let expected_at = layout.data_at as u64 + info.offset;
                assert_eq!(
                    &bytes[expected_at as usize..][..written.data.len()],
                    &written.data[..],
                    "{ctx}"
                );
                // Tensor data in memory keeps the file's alignment (up to the
                // 64 bytes a heap copy guarantees).
                let ptr = gguf.tensor_bytes(info).unwrap().as_ptr() as u64;
                assert_eq!(
                    ptr % alignment.min(64),
                    0,
                    "{ctx}: tensor {} at {ptr:#x}",
                    info.name
                );
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn alignment_defaults_to_32_when_general_alignment_is_absent() {
    assert_eq!(DEFAULT_ALIGNMENT, 32);
    let w = odd_sized_tensors(GgufWriter::new().kv("general.name", Meta::str("x")));
    let (bytes, layout) = w.build_with_layout();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    assert_eq!(gguf.alignment(), 32);
    assert_eq!(gguf.data_offset(), layout.data_at as u64);
    assert_eq!(gguf.data_offset() % 32, 0);
    for (info, written) in gguf.tensors().iter().zip(&w.tensors) {
        assert_eq!(info.offset % 32, 0, "tensor {}", info.name);
        assert_eq!(
            gguf.tensor_bytes(info).unwrap(),
            &written.data[..],
            "tensor {}",
            info.name
        );
    }
}

// ---------------------------------------------------------------------------
// Tensor infos and bytes
// ---------------------------------------------------------------------------

/// (name, dims, type id, expected type, expected byte size)
fn mixed_tensors() -> Vec<(&'static str, Vec<u64>, u32, GgmlType, u64)> {
    vec![
        ("f32.vector", vec![7], tt::F32, GgmlType::F32, 28),
        ("f32.4d", vec![2, 3, 4, 5], tt::F32, GgmlType::F32, 480),
        ("f16.matrix", vec![7, 3], tt::F16, GgmlType::F16, 42),
        ("bf16.vector", vec![4], tt::BF16, GgmlType::Bf16, 8),
        // 2 rows × 2 blocks × 18 bytes.
        ("q4_0.matrix", vec![64, 2], tt::Q4_0, GgmlType::Q4_0, 72),
        // 3 rows × 1 block × 34 bytes.
        ("q8_0.matrix", vec![32, 3], tt::Q8_0, GgmlType::Q8_0, 102),
        // 1 row × 1 super-block × 144 bytes.
        ("q4_k.row", vec![256, 1], tt::Q4_K, GgmlType::Q4K, 144),
        // Valid GGUF even though this build does not compute with it.
        (
            "iq2_xxs.row",
            vec![256, 2],
            tt::IQ2_XXS,
            GgmlType::Iq2Xxs,
            132,
        ),
        (
            "a.name.of.exactly.sixty.three.bytes.xxxxxxxxxxxxxxxxxxxxxxxxxxx",
            vec![1],
            tt::F32,
            GgmlType::F32,
            4,
        ),
        ("名前.🦀", vec![1, 1, 1, 1], tt::F32, GgmlType::F32, 4),
    ]
}

fn mixed_tensor_file() -> GgufWriter {
    let mut w = GgufWriter::new().kv("general.architecture", Meta::str("test"));
    for (i, (name, dims, type_id, _, size)) in mixed_tensors().into_iter().enumerate() {
        let data: Vec<u8> = (0..size)
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        w = w.tensor(name, &dims, type_id, data);
    }
    w
}

#[test]
fn tensor_infos_report_names_dims_types_offsets_and_byte_sizes() {
    assert_eq!(mixed_tensors()[8].0.len(), 63);
    let w = mixed_tensor_file();
    let (bytes, layout) = w.build_with_layout();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    assert_eq!(gguf.tensors().len(), mixed_tensors().len());
    let mut expected_offset = 0;
    for (info, (name, dims, _, ty, size)) in gguf.tensors().iter().zip(mixed_tensors()) {
        assert_eq!(info.name, name);
        assert_eq!(info.dims, dims, "{name}");
        assert_eq!(info.ggml_type, ty, "{name}");
        assert_eq!(info.n_bytes, size, "{name}");
        assert_eq!(info.n_elements(), dims.iter().product::<u64>(), "{name}");
        assert_eq!(info.offset, expected_offset, "{name}");
        expected_offset = (expected_offset + size).div_ceil(32) * 32;
        assert_eq!(gguf.tensor(name), Some(info), "lookup by name");
    }
    assert_eq!(gguf.tensor("not.there"), None);
    assert_eq!(gguf.data_offset(), layout.data_at as u64);
}

#[test]
fn quantized_tensor_sizes_follow_the_block_geometry() {
    let bytes = GgufWriter::new()
        .tensor("q4_0", &[64, 2], tt::Q4_0, vec![0xAB; 72])
        .tensor("q4_k", &[256, 1], tt::Q4_K, vec![0xCD; 144])
        .build();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    let q4_0 = gguf.tensor("q4_0").unwrap();
    assert_eq!((q4_0.ggml_type, q4_0.n_bytes), (GgmlType::Q4_0, 2 * 2 * 18));
    assert_eq!(gguf.tensor_bytes(q4_0).unwrap(), &[0xAB; 72][..]);
    let q4_k = gguf.tensor("q4_k").unwrap();
    assert_eq!((q4_k.ggml_type, q4_k.n_bytes), (GgmlType::Q4K, 144));
    assert_eq!(gguf.tensor_bytes(q4_k).unwrap(), &[0xCD; 144][..]);
}

#[test]
fn tensor_bytes_return_exactly_the_written_data() {
    let w = mixed_tensor_file();
    let bytes = w.build();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    for (info, written) in gguf.tensors().iter().zip(&w.tensors) {
        assert_eq!(
            gguf.tensor_bytes(info).unwrap(),
            &written.data[..],
            "{}",
            info.name
        );
    }
}

#[test]
fn tensors_read_identically_from_v2_and_v3_files() {
    let mut w = mixed_tensor_file();
    let v3 = GgufFile::from_bytes(&w.build()).unwrap();
    w.version = 2;
    let v2 = GgufFile::from_bytes(&w.build()).unwrap();
    assert_eq!((v2.version(), v3.version()), (2, 3));
    assert_eq!(v2.tensors(), v3.tensors());
    for info in v2.tensors() {
        assert_eq!(
            v2.tensor_bytes(info),
            v3.tensor_bytes(info),
            "{}",
            info.name
        );
    }
}

// ---------------------------------------------------------------------------
// Ways of opening a file
// ---------------------------------------------------------------------------

#[test]
fn mmap_read_and_header_only_opens_agree_with_from_bytes() {
    let mut w = mixed_tensor_file();
    w.kvs.extend(every_kind_of_value());
    let bytes = w.build();
    let path = write_scratch("open-modes.gguf", &bytes);
    let reference = GgufFile::from_bytes(&bytes).unwrap();
    for options in all_read_options() {
        let ctx = format!("{options:?}");
        let gguf = GgufFile::open(&path, options).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(gguf.version(), reference.version(), "{ctx}");
        assert_eq!(gguf.alignment(), reference.alignment(), "{ctx}");
        assert_eq!(gguf.data_offset(), reference.data_offset(), "{ctx}");
        assert_eq!(gguf.file_size(), bytes.len() as u64, "{ctx}");
        assert_eq!(gguf.tensors(), reference.tensors(), "{ctx}");
        let ours: Vec<_> = gguf.metadata().collect();
        let theirs: Vec<_> = reference.metadata().collect();
        assert_eq!(ours.len(), theirs.len(), "{ctx}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.key, b.key, "{ctx}");
            assert!(same_value(a.value, b.value), "{ctx}: key {}", a.key);
        }
        match options.load_data {
            true => {
                let data = gguf.data().unwrap_or_else(|| panic!("{ctx}: no data"));
                assert_eq!(data.is_mapped(), options.use_mmap, "{ctx}");
                assert_eq!(
                    data.bytes(),
                    &bytes[reference.data_offset() as usize..],
                    "{ctx}"
                );
                for info in gguf.tensors() {
                    assert_eq!(
                        gguf.tensor_bytes(info),
                        reference.tensor_bytes(info),
                        "{ctx}: {}",
                        info.name
                    );
                    assert!(gguf.tensor_bytes(info).is_some(), "{ctx}: {}", info.name);
                }
            }
            false => {
                assert!(
                    gguf.data().is_none(),
                    "{ctx}: data loaded though load_data is false"
                );
                for info in gguf.tensors() {
                    assert_eq!(gguf.tensor_bytes(info), None, "{ctx}: {}", info.name);
                }
            }
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_with_zero_tensors_and_no_data_section_parses() {
    // The writer adds no padding when there are no tensors, so the file ends
    // right after the metadata, before the aligned data offset would be.
    let cases = [
        ("no-metadata", GgufWriter::new()),
        (
            "metadata-only",
            GgufWriter::new()
                .kv("general.name", Meta::str("empty"))
                .kv("x", Meta::U8(1)),
        ),
        (
            "aligned-256",
            GgufWriter::new().kv("general.alignment", Meta::U32(256)),
        ),
    ];
    // Every way of reading is tried and every failure (panics included) is
    // collected, so that one broken path does not hide the others.
    let mut failures = Vec::new();
    for (name, w) in cases {
        let bytes = w.build();
        assert!(
            bytes.len() % 32 != 0,
            "{name}: the case should end off an alignment boundary ({} bytes)",
            bytes.len()
        );
        let path = write_scratch(&format!("zero-tensors-{name}.gguf"), &bytes);
        let mut ways: Vec<(String, Option<ReadOptions>)> = vec![("from_bytes".into(), None)];
        ways.extend(
            all_read_options()
                .into_iter()
                .map(|o| (format!("open {o:?}"), Some(o))),
        );
        for (how, options) in ways {
            let result = std::panic::catch_unwind(|| {
                let gguf = match options {
                    None => GgufFile::from_bytes(&bytes),
                    Some(options) => GgufFile::open(&path, options),
                }
                .map_err(|e| format!("error: {e}"))?;
                if !gguf.tensors().is_empty() {
                    return Err(format!("{} tensors", gguf.tensors().len()));
                }
                if gguf.metadata().count() != w.kvs.len() || gguf.file_size() != bytes.len() as u64
                {
                    return Err("wrong metadata count or file size".to_string());
                }
                if let Some(data) = gguf.data() {
                    if !data.bytes().is_empty() {
                        return Err(format!("{} bytes of tensor data", data.bytes().len()));
                    }
                }
                Ok(())
            });
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("{name} ({} bytes), {how}: {e}", bytes.len())),
                Err(_) => failures.push(format!(
                    "{name} ({} bytes), {how}: panicked (message above)",
                    bytes.len()
                )),
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(
        failures.is_empty(),
        "zero-tensor files failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn tensor_bytes_of_a_tensor_info_outside_the_data_is_none() {
    // TensorInfo is a plain public struct, so a caller can pass one that did
    // not come from this file; its range is then checked, not trusted.
    let bytes = GgufWriter::new()
        .tensor("t", &[4], tt::F32, f32_bytes(4, 1))
        .build();
    let gguf = GgufFile::from_bytes(&bytes).unwrap();
    let mut info = gguf.tensor("t").unwrap().clone();
    for (offset, n_bytes) in [
        (32, 16),
        (0, 17),
        (u64::MAX, 1),
        (u64::MAX - 3, 16),
        (1 << 40, 1 << 40),
    ] {
        info.offset = offset;
        info.n_bytes = n_bytes;
        let result = std::panic::catch_unwind(|| gguf.tensor_bytes(&info).map(<[u8]>::len));
        assert!(
            matches!(result, Ok(None)),
            "offset {offset}, n_bytes {n_bytes}: {result:?}"
        );
    }
}
