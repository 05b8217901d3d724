//! Code point classes, UTF-8 helpers and the GPT-2 byte <-> character map.
//!
//! The classes are those llama.cpp's pre-tokenizers test: the general
//! categories \p{N} \p{L} \p{Z} \p{M} \p{P} \p{S} \p{C} and \s, from a table
//! generated the way llama.cpp generates its own (`gen_unicode_data.py`).

use std::sync::LazyLock;

mod data {
    include!("unicode_data.rs");
}

/// Class bits of a code point (see `gen_unicode_data.py` for their order).
pub(crate) const NUMBER: u8 = 1 << 0;
pub(crate) const LETTER: u8 = 1 << 1;
pub(crate) const SEPARATOR: u8 = 1 << 2;
pub(crate) const ACCENT_MARK: u8 = 1 << 3;
pub(crate) const PUNCTUATION: u8 = 1 << 4;
pub(crate) const SYMBOL: u8 = 1 << 5;
pub(crate) const CONTROL: u8 = 1 << 6;
pub(crate) const WHITESPACE: u8 = 1 << 7;

/// The general-category bits alone (without WHITESPACE).
pub(crate) const CATEGORIES: u8 =
    NUMBER | LETTER | SEPARATOR | ACCENT_MARK | PUNCTUATION | SYMBOL | CONTROL;

/// The classes of the Basic Multilingual Plane, one byte each, for O(1) lookups
/// of nearly every character real text holds.
static BMP: LazyLock<Box<[u8]>> = LazyLock::new(|| {
    let mut table = vec![0u8; 0x10000].into_boxed_slice();
    let ranges = &data::CLASS_RANGES;
    for (i, &(start, flags)) in ranges.iter().enumerate() {
        let end = ranges.get(i + 1).map_or(0x110000, |r| r.0);
        if start >= 0x10000 {
            break;
        }
        table[start as usize..end.min(0x10000) as usize].fill(flags);
    }
    table
});

/// The class bits of `cp`; every code point up to U+10FFFF has at least one
/// category (unassigned ones are \p{C}), anything beyond has none.
pub(crate) fn classes(cp: u32) -> u8 {
    if cp < 0x10000 {
        return BMP[cp as usize];
    }
    if cp >= 0x110000 {
        return 0;
    }
    let ranges = &data::CLASS_RANGES;
    let i = ranges.partition_point(|&(start, _)| start <= cp);
    ranges[i - 1].1
}

/// The length of a UTF-8 sequence as its first byte announces it (1 for a
/// stray continuation byte), the way llama.cpp steps through text.
pub(crate) fn utf8_len(first: u8) -> usize {
    const LOOKUP: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(first >> 4) as usize] as usize
}

/// GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes for U+0100.. in byte order.
static BYTE_TO_CHAR: LazyLock<[char; 256]> = LazyLock::new(|| {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        map[b as usize] = if printable(b) {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        };
    }
    map
});

/// The character GPT-2's byte-level BPE writes for byte `b`.
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The inverse of [`BYTE_TO_CHAR`]: code points 0..324 to the byte each
/// stands for, or -1.
static CHAR_TO_BYTE: LazyLock<[i16; 324]> = LazyLock::new(|| {
    let mut map = [-1i16; 324];
    for b in 0..=255u8 {
        map[byte_to_char(b) as usize] = i16::from(b);
    }
    map
});

/// The byte a GPT-2 byte-level character stands for, if it is one.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let b = *CHAR_TO_BYTE.get(c as usize)?;
    u8::try_from(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_familiar_characters() {
        assert_eq!(classes('a' as u32), LETTER);
        assert_eq!(classes('7' as u32), NUMBER);
        assert_eq!(classes(' ' as u32), SEPARATOR | WHITESPACE);
        assert_eq!(classes('\n' as u32), CONTROL | WHITESPACE);
        assert_eq!(classes('!' as u32), PUNCTUATION);
        assert_eq!(classes('$' as u32), SYMBOL);
        assert_eq!(classes(0x0301), ACCENT_MARK); // combining acute
        assert_eq!(classes(0x3000), SEPARATOR | WHITESPACE); // ideographic space
        assert_eq!(classes(0x1F600), SYMBOL); // emoji
        assert_eq!(classes(0x20000), LETTER); // CJK extension B
        assert_eq!(classes(0x10FFFF), CONTROL); // unassigned: \p{C}
        assert_eq!(classes(0x110000), 0);
        assert_eq!(
            classes(0x1C),
            CONTROL,
            "\\x1c is not \\s for the regex module"
        );
    }

    #[test]
    fn the_byte_alphabet_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), '\u{120}'); // Ġ
        assert_eq!(byte_to_char(b'\n'), '\u{10A}'); // Ċ
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(char_to_byte('\u{200}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
