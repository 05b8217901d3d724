//! GGUF metadata values: the thirteen value types, arrays of any of them
//! (arrays of arrays included), and typed accessors that say what went wrong.

use crate::error::{echo, Error, Result};

/// A GGUF metadata value type, by its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in the file: strings and
    /// arrays carry at least their 8-byte length (arrays also a 4-byte type).
    pub fn min_encoded_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array; arrays of arrays hold arrays of any element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float value of either width; `None` for anything else.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A short description of the value's type for error messages, e.g.
    /// `string` or `array of f32`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(array) => format!("array of {}", array.element_type().name()),
            other => other.value_type().name().to_string(),
        }
    }
}

impl Array {
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A metadata key with its value, for typed lookups whose errors name the key.
pub struct Entry<'a> {
    pub key: &'a str,
    pub value: &'a Value,
}

impl Entry<'_> {
    fn wrong_type(&self, expected: &str) -> Error {
        Error::format(format!(
            "metadata key '{}' has type {}, expected {expected}",
            echo(self.key),
            self.value.type_description()
        ))
    }

    /// An integer of any width within `range`, as u32.
    pub fn u32_in(&self, range: std::ops::RangeInclusive<u32>) -> Result<u32> {
        let v = self
            .value
            .as_i128()
            .ok_or_else(|| self.wrong_type("an integer"))?;
        if v < i128::from(*range.start()) || v > i128::from(*range.end()) {
            return Err(Error::format(format!(
                "metadata key '{}' = {v} is out of range ({}..={})",
                echo(self.key),
                range.start(),
                range.end()
            )));
        }
        Ok(v as u32)
    }

    /// A finite float (f32 or f64) within `range`, as f32.
    pub fn f32_in(&self, range: std::ops::RangeInclusive<f32>) -> Result<f32> {
        let v = self
            .value
            .as_f64()
            .ok_or_else(|| self.wrong_type("a float"))?;
        if !v.is_finite() || v < f64::from(*range.start()) || v > f64::from(*range.end()) {
            return Err(Error::format(format!(
                "metadata key '{}' = {v} is out of range ({}..={})",
                echo(self.key),
                range.start(),
                range.end()
            )));
        }
        Ok(v as f32)
    }

    pub fn str(&self) -> Result<&str> {
        match self.value {
            Value::String(s) => Ok(s),
            _ => Err(self.wrong_type("a string")),
        }
    }

    pub fn bool(&self) -> Result<bool> {
        match self.value {
            Value::Bool(b) => Ok(*b),
            _ => Err(self.wrong_type("a bool")),
        }
    }

    pub fn array(&self) -> Result<&Array> {
        match self.value {
            Value::Array(a) => Ok(a),
            _ => Err(self.wrong_type("an array")),
        }
    }

    pub fn string_array(&self) -> Result<&[String]> {
        match self.value {
            Value::Array(Array::String(v)) => Ok(v),
            _ => Err(self.wrong_type("an array of string")),
        }
    }
}
