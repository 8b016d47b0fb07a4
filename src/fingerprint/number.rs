//! Canonical numbers: the exact value of the literal, in the layout of
//! ECMAScript's `Number.prototype.toString` (RFC 8785 section 3.2.2.3).
//!
//! RFC 8785 writes the IEEE 754 double nearest to a number. For a literal whose
//! value *is* the shortest round-trip form of that double (`1.5`, `0.1`, `1E30`,
//! `4.50`, every literal of at most 15 significant digits) the double's form and
//! the literal's exact value are the same text, so writing the exact value keeps
//! RFC 8785's output. For any other literal (`9007199254740993`,
//! `0.10000000000000001`, `1e-400`, and `-0`) the double would hide a
//! difference that a handler reading the literal as an integer, a decimal or
//! raw text can see, so the exact value is written instead. Equal values always
//! give equal text and different values different text: two bodies share a
//! canonical form exactly when they hold the same values.

/// The largest exponent magnitude written. Beyond it the number is left to
/// the raw-bytes fingerprint, so exponent arithmetic never overflows.
const MAX_EXPONENT: i64 = 1 << 30;

/// Digits kept on the stack; longer literals (rare) use the heap.
const STACK_DIGITS: usize = 40;

/// Writes the canonical form of `literal`, a number in JSON's grammar (RFC
/// 8259 section 6). `None` when it is out of double range (as serde_json
/// refuses it) or its exponent is beyond [`MAX_EXPONENT`].
pub(crate) fn write_number_literal(out: &mut Vec<u8>, literal: &[u8]) -> Option<()> {
    let (negative, unsigned) = match literal.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, literal),
    };
    let exponent_at = unsigned
        .iter()
        .position(|&b| b == b'e' || b == b'E')
        .unwrap_or(unsigned.len());
    let (mantissa, exponent_text) = unsigned.split_at(exponent_at);
    let (int_digits, frac_digits) = match mantissa.iter().position(|&b| b == b'.') {
        Some(dot) => (&mantissa[..dot], &mantissa[dot + 1..]),
        None => (mantissa, &[][..]),
    };
    let all = || int_digits.iter().chain(frac_digits).copied();
    let total = int_digits.len() + frac_digits.len();
    let leading = all().take_while(|&b| b == b'0').count();
    if leading == total {
        // Zero, in any spelling; its sign is kept, as serde_json keeps it.
        out.extend_from_slice(if negative { b"-0" } else { b"0" });
        return Some(());
    }
    let trailing = all().rev().take_while(|&b| b == b'0').count();
    let count = total - leading - trailing;
    let exponent = parse_exponent(exponent_text)?;
    // The decimal exponent of the first significant digit.
    let first = int_digits.len() as i64 - 1 - leading as i64 + exponent;
    if !(-MAX_EXPONENT..=MAX_EXPONENT).contains(&first) {
        return None;
    }
    // Below 1e308 every value is a finite double; at 1e308 rounding decides.
    if first >= 308 {
        let value: f64 = std::str::from_utf8(literal).ok()?.parse().ok()?;
        if !value.is_finite() {
            return None;
        }
    }
    let mut stack = [0u8; STACK_DIGITS];
    let heap: Vec<u8>;
    let digits = if count <= STACK_DIGITS {
        for (slot, digit) in stack.iter_mut().zip(all().skip(leading).take(count)) {
            *slot = digit;
        }
        &stack[..count]
    } else {
        heap = all().skip(leading).take(count).collect();
        &heap[..]
    };
    if negative {
        out.push(b'-');
    }
    write_es6_digits(out, digits, first);
    Some(())
}

/// The value of an exponent part (`e-7`, `E+21`, or empty), clamped beyond
/// [`MAX_EXPONENT`] so that a thousand-digit exponent cannot overflow.
fn parse_exponent(text: &[u8]) -> Option<i64> {
    let Some((_, rest)) = text.split_first() else {
        return Some(0);
    };
    let (negative, digits) = match rest.split_first()? {
        (b'-', digits) => (true, digits),
        (b'+', digits) => (false, digits),
        _ => (false, rest),
    };
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        value = (value * 10 + i64::from(b - b'0')).min(4 * MAX_EXPONENT);
    }
    Some(if negative { -value } else { value })
}

/// Writes significant `digits` (no leading or trailing zero) whose first digit
/// has decimal exponent `exponent`, as ECMAScript's `Number.prototype.toString`
/// lays out a number: plain from 1e-6 up to 1e21, else `d.ddde+N` / `d.ddde-N`.
pub(crate) fn write_es6_digits(out: &mut Vec<u8>, digits: &[u8], exponent: i64) {
    let k = digits.len() as i64;
    let n = exponent + 1;
    if k <= n && n <= 21 {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if n > 0 { b'+' } else { b'-' });
        out.extend_from_slice(itoa_u64((n - 1).unsigned_abs(), &mut [0u8; 20]));
    }
}

pub(crate) fn itoa_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}
