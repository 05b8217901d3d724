//! JSON text, for the one report the library writes (`m40_model_describe`).

use std::fmt::{Display, Write};

/// A JSON object written field by field, in order.
pub(crate) struct JsonObject {
    text: String,
}

impl JsonObject {
    pub fn new() -> JsonObject {
        JsonObject {
            text: String::from("{"),
        }
    }

    /// A field whose value is JSON text already: a number, `true`, `null`,
    /// or a finished object.
    pub fn value(&mut self, key: &str, value: impl Display) -> &mut JsonObject {
        if self.text.len() > 1 {
            self.text.push(',');
        }
        self.text.push_str(&string(key));
        let _ = write!(self.text, ":{value}");
        self
    }

    /// A string field, `null` where there is none.
    pub fn string(&mut self, key: &str, value: Option<&str>) -> &mut JsonObject {
        self.value(key, value.map_or_else(|| "null".to_string(), string))
    }

    pub fn finish(mut self) -> String {
        self.text.push('}');
        self.text
    }
}

/// `s` as a JSON string literal.
pub(crate) fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }

    #[test]
    fn objects_separate_fields_with_commas_and_write_null_for_absent_strings() {
        let mut inner = JsonObject::new();
        inner.value("n", 1);
        let mut o = JsonObject::new();
        o.string("a", Some("x"))
            .string("b", None)
            .value("c", inner.finish());
        assert_eq!(o.finish(), r#"{"a":"x","b":null,"c":{"n":1}}"#);
        assert_eq!(JsonObject::new().finish(), "{}");
    }
}
