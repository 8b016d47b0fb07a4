//! Numbers: fingerprinted by their literal text, exactly as sent.
//!
//! RFC 8785 section 3.2.2.3 writes each number as the shortest form of its
//! nearest IEEE 754 double, so `2` and `2.0`, `1.5` and `1.50`, `100` and `1e2`
//! would be one request. A handler tells them apart: serde rejects `2.0` for an
//! integer field, a decimal type keeps the scale of `1.50`, and code reading the
//! raw text sees other bytes. So a number's canonical form is its literal,
//! checked against the grammar of RFC 8259 section 6; this is the one place the
//! canonical form deviates from RFC 8785. It also keeps number conversion off
//! the hot path.

/// The end of the run of ASCII digits starting at `i`.
#[inline(always)]
fn digits_end(input: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = input.get(i) {
        i += 1;
    }
    i
}

/// The end of the number literal at `at`: `None` unless it is a number in
/// JSON's grammar (no leading zeros, `+`, bare `.`, `NaN`, ...) within double
/// range, which is what serde_json accepts. The caller checks what follows.
#[inline(always)]
pub(super) fn number_end(input: &[u8], at: usize) -> Option<usize> {
    let int_start = at + usize::from(input.get(at) == Some(&b'-'));
    let int_end = digits_end(input, int_start);
    let int_len = int_end - int_start;
    if int_len == 0 || (int_len > 1 && input[int_start] == b'0') {
        return None;
    }
    let mut end = int_end;
    if input.get(end) == Some(&b'.') {
        let frac_end = digits_end(input, end + 1);
        if frac_end == end + 1 {
            return None;
        }
        end = frac_end;
    }
    match input.get(end) {
        Some(b'e' | b'E') => exponent_end(input, at, int_len, end),
        // Below 10^308 every number is a finite double.
        _ if int_len <= 308 => Some(end),
        _ => in_double_range(&input[at..end]).then_some(end),
    }
}

/// The end of a number whose exponent part starts at `e` (the `e` or `E`),
/// `None` if it has no digit or the number is out of double range.
#[inline(never)]
fn exponent_end(input: &[u8], at: usize, int_len: usize, e: usize) -> Option<usize> {
    let sign = input.get(e + 1).copied();
    let start = e + 1 + usize::from(matches!(sign, Some(b'-' | b'+')));
    let end = digits_end(input, start);
    if end == start {
        return None;
    }
    // Clamped, so that a thousand-digit exponent cannot overflow.
    let exponent = input[start..end]
        .iter()
        .fold(0usize, |e, &d| (e * 10 + usize::from(d - b'0')).min(1000));
    // The value is below 10^(int_len + exponent); parsed only when that may
    // reach double range's end (about 1.8e308).
    let bound = int_len + if sign == Some(b'-') { 0 } else { exponent };
    (bound <= 308 || in_double_range(&input[at..end])).then_some(end)
}

/// Whether a number literal in JSON's grammar is a finite double once rounded,
/// as serde_json (with `float_roundtrip`, so correctly rounded) decides it.
#[cold]
fn in_double_range(literal: &[u8]) -> bool {
    std::str::from_utf8(literal)
        .ok()
        .and_then(|text| text.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}
