//! An exact model of a JSON text, written independently of the crate: the
//! oracle for "two bodies share a canonical form exactly when a handler cannot
//! tell them apart". Numbers are kept as their literal text, so `2` and `2.0`,
//! `1.5` and `1.50`, `-0` and `0`, `100` and `1e2` are different values (a
//! typed handler tells them apart). Strings are kept decoded and object members
//! sorted, so string escapes, key order and whitespace do not count. Also used
//! by the fuzz target (`fuzz/`).
#![allow(dead_code)]

use std::collections::BTreeMap;

/// A JSON value with exact numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exact {
    Null,
    Bool(bool),
    /// The literal, exactly as written.
    Number(String),
    String(String),
    Array(Vec<Exact>),
    Object(BTreeMap<String, Exact>),
}

/// Parses `text` as one JSON value (RFC 8259): `None` when it is not JSON,
/// has a duplicate key, a lone surrogate, or nests deeper than `max_depth`.
pub fn parse(text: &[u8], max_depth: usize) -> Option<Exact> {
    let mut p = Parser {
        s: text,
        i: 0,
        max_depth,
    };
    let v = p.value(0)?;
    p.ws();
    (p.i == text.len()).then_some(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    max_depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Exact> {
        self.ws();
        match *self.s.get(self.i)? {
            b'{' | b'[' if depth >= self.max_depth => None,
            b'{' => {
                self.i += 1;
                let mut map = BTreeMap::new();
                if self.eat(b'}') {
                    return Some(Exact::Object(map));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return None;
                    }
                    let key = self.string()?;
                    if !self.eat(b':') {
                        return None;
                    }
                    let v = self.value(depth + 1)?;
                    if map.insert(key, v).is_some() {
                        return None;
                    }
                    if self.eat(b'}') {
                        return Some(Exact::Object(map));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Some(Exact::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Some(Exact::Array(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'"' => self.string().map(Exact::String),
            b't' => self.word(b"true", Exact::Bool(true)),
            b'f' => self.word(b"false", Exact::Bool(false)),
            b'n' => self.word(b"null", Exact::Null),
            _ => self.number(),
        }
    }

    fn word(&mut self, w: &[u8], v: Exact) -> Option<Exact> {
        if self.s[self.i..].starts_with(w) {
            self.i += w.len();
            Some(v)
        } else {
            None
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.i += 4;
        u32::from_str_radix(h, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let rest = self.s.get(self.i..)?;
            let run = rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
            out.push_str(std::str::from_utf8(&rest[..run]).ok()?);
            self.i += run;
            match self.s[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.i += 1;
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.i..self.i + 2)? != b"\\u" {
                                    return None;
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)?
                            }
                        }
                        _ => return None,
                    };
                    out.push(c);
                }
                _ => return None, // a control character
            }
        }
    }

    fn digits(&mut self) -> &[u8] {
        let start = self.i;
        while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    fn number(&mut self) -> Option<Exact> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let int = self.digits();
        if int.is_empty() || (int.len() > 1 && int[0] == b'0') {
            return None;
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits().is_empty() {
                return None;
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'-' | b'+')) {
                self.i += 1;
            }
            if self.digits().is_empty() {
                return None;
            }
        }
        // Out of double range: serde_json refuses it, and so does the crate.
        let literal = std::str::from_utf8(&self.s[start..self.i]).ok()?;
        if !literal.parse::<f64>().ok()?.is_finite() {
            return None;
        }
        Some(Exact::Number(literal.to_owned()))
    }
}

/// The canonical text of `value`, written independently of the crate: members
/// sorted by UTF-16 code units, minimal string escapes, no whitespace (RFC
/// 8785), and each number as its literal (the crate's deviation from RFC 8785
/// section 3.2.2.3).
pub fn canonical(value: &Exact) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Exact, out: &mut String) {
    match value {
        Exact::Null => out.push_str("null"),
        Exact::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Exact::Number(literal) => out.push_str(literal),
        Exact::String(s) => escape(s, out),
        Exact::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Exact::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                escape(k, out);
                out.push(':');
                write(v, out);
            }
            out.push('}');
        }
    }
}

/// Minimal JSON string escaping, as RFC 8785 writes strings.
pub fn escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
