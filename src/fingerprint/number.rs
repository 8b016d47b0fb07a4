//! ECMAScript number serialisation (RFC 8785 section 3.2.2.3).

/// Integers up to 2^53 are exact doubles and print as plain digits; larger ones
/// are rounded to a double first, as ECMAScript would.
pub(super) fn write_integer_or_double(out: &mut Vec<u8>, magnitude: u64, negative: bool) {
    const MAX_SAFE: u64 = 1 << 53;
    if magnitude <= MAX_SAFE {
        if negative && magnitude != 0 {
            out.push(b'-');
        }
        out.extend_from_slice(itoa_u64(magnitude, &mut [0u8; 20]));
    } else {
        let v = magnitude as f64;
        write_es6_number(out, if negative { -v } else { v });
    }
}

pub(super) fn itoa_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
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

/// Serialises a finite double per ECMAScript `Number.prototype.toString`.
pub(crate) fn write_es6_number(out: &mut Vec<u8>, v: f64) {
    if v == 0.0 {
        out.push(b'0');
        return;
    }
    if v < 0.0 {
        out.push(b'-');
    }
    // At most 17 significant digits: kept on the stack.
    let mut digit_buf = [0u8; 24];
    let mut int_buf = [0u8; 20];
    let even;
    let (mut digits, exponent) = match short_decimal(v.abs()) {
        Some((n, fraction_digits)) => {
            let d = itoa_u64(n, &mut int_buf);
            let exponent = d.len() as i32 - 1 - fraction_digits;
            let significant = d.len() - d.iter().rev().take_while(|&&b| b == b'0').count();
            (&d[..significant], exponent)
        }
        None => shortest_digits(v.abs(), &mut digit_buf),
    };
    // The exact (800-digit) tie check is expensive; run it only when the value's
    // exact decimal expansion has the one length a tie needs.
    if digits.last().is_some_and(|d| d % 2 == 1) && tie_possible(v.abs(), digits.len()) {
        if let Some(found) = even_tie_digits(v.abs(), digits, exponent) {
            even = found;
            digits = &even;
        }
    }
    write_es6_digits(out, digits, exponent);
}

/// Writes shortest round-trip `digits` (no trailing zero) whose first digit has
/// decimal exponent `exponent`, per ECMAScript `Number.prototype.toString`.
pub(super) fn write_es6_digits(out: &mut Vec<u8>, digits: &[u8], exponent: i32) {
    let k = digits.len() as i32;
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
        out.extend_from_slice(itoa_u64((n - 1).unsigned_abs() as u64, &mut [0u8; 20]));
    }
}

/// The shortest round-trip digits of the finite, positive `v` and the decimal
/// exponent of the first one, from Rust's `{:e}` (shortest, like ECMAScript).
pub(super) fn shortest_digits(v: f64, digit_buf: &mut [u8; 24]) -> (&[u8], i32) {
    use std::io::Write;
    let mut buf = [0u8; 40];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        write!(cursor, "{v:e}").expect("buffer is large enough for any f64");
        cursor.position() as usize
    };
    let text = &buf[..len];
    let e_at = text
        .iter()
        .position(|&b| b == b'e')
        .expect("{:e} has an exponent");
    let mut k = 0;
    for &b in &text[..e_at] {
        if b != b'.' {
            digit_buf[k] = b;
            k += 1;
        }
    }
    let exponent: i32 = std::str::from_utf8(&text[e_at + 1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("{:e} exponent is an integer");
    (&digit_buf[..k], exponent)
}

/// `Some((n, j))` when the positive `v` is the double nearest to the decimal
/// `n / 10^j` with `n < 10^15` and `j <= 15`: such a decimal has at most 15
/// significant digits, and no two decimals of at most 15 digits round to the same
/// double, so it is the unique shortest round-trip form (no tie either, which
/// needs 16 digits or more). `n / 10^j` in floating point is correctly rounded,
/// so the comparison is exact.
pub(super) fn short_decimal(v: f64) -> Option<(u64, i32)> {
    const POW10: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    const LIMIT: f64 = 1e15;
    for (j, p) in POW10.iter().enumerate() {
        let n = (v * p).round();
        if n >= LIMIT {
            return None;
        }
        if n >= 1.0 && n / p == v {
            return Some((n as u64, j as i32));
        }
    }
    None
}

/// Whether the exact decimal expansion of the finite, non-zero `v` has exactly
/// `k + 1` significant digits. A tie (see [`even_tie_digits`]) needs the exact
/// value to be `k` digits followed by a single `5`, so when this is false
/// `even_tie_digits(v, digits, _)` with `k` digits is `None`, and is skipped.
/// Integer arithmetic only; answers `true` (check exactly) when it cannot tell.
pub(super) fn tie_possible(v: f64, k: usize) -> bool {
    let bits = v.abs().to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    // v = m * 2^q exactly.
    let (mut m, mut q) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    if m == 0 {
        return false;
    }
    let tz = m.trailing_zeros();
    m >>= tz;
    q += tz as i32;
    let significant = if q >= 0 {
        // An integer: m * 2^q, without its trailing decimal zeros.
        if (64 - m.leading_zeros()) as i32 + q > 127 {
            return true;
        }
        let mut n = u128::from(m) << q;
        while n % 10 == 0 {
            n /= 10;
        }
        decimal_len(n)
    } else {
        // m odd: v = m * 5^x / 10^x, and m * 5^x (odd) has no trailing zero.
        let x = q.unsigned_abs();
        if x > 32 {
            // m * 5^x >= 5^33 > 10^23: more than the 18 digits a tie can have.
            return false;
        }
        decimal_len(u128::from(m) * 5u128.pow(x))
    };
    significant == k + 1
}

pub(super) fn decimal_len(mut n: u128) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// ECMAScript breaks a tie between two shortest digit strings (the double lies
/// exactly halfway) towards the even one; Rust's formatter rounds half up.
/// Returns the even digits when `digits` lost such a tie. Odd last digits only.
pub(super) fn even_tie_digits(v: f64, digits: &[u8], exponent: i32) -> Option<Vec<u8>> {
    // A double's exact decimal expansion has at most 767 significant digits.
    let exact = format!("{v:.800e}");
    let (mantissa, exact_exponent) = exact.split_once('e')?;
    if exact_exponent.parse::<i32>().ok()? != exponent {
        return None;
    }
    let exact_digits: Vec<u8> = mantissa.bytes().filter(|&b| b != b'.').collect();
    let (prefix, rest) = exact_digits.split_at(digits.len());
    let is_tie = rest.first() == Some(&b'5') && rest[1..].iter().all(|&b| b == b'0');
    if !is_tie {
        return None;
    }
    let mut even = prefix.to_vec();
    if even.last()? % 2 == 1 {
        // Round the prefix up by one unit in its last place.
        let mut i = even.len();
        loop {
            i = i.checked_sub(1)?;
            if even[i] == b'9' {
                even[i] = b'0';
            } else {
                even[i] += 1;
                break;
            }
        }
    }
    let candidate = format!("0.{}e{}", std::str::from_utf8(&even).ok()?, exponent + 1);
    (even != digits && candidate.parse::<f64>().ok()? == v).then_some(even)
}
