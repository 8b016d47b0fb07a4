//! Numbers on the fast path: their source text when canonical, else rewritten.

use super::*;

/// The end of the run of ASCII digits starting at `i`.
#[inline(always)]
fn digits_end(input: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = input.get(i) {
        i += 1;
    }
    i
}

/// The end of the number at `at` when its source text is its canonical form:
/// a plain integer of at most 15 digits other than -0, or a plain decimal of
/// at most 15 significant digits, with no trailing zero, that ECMAScript
/// prints without an exponent. `None` for anything else, valid or not.
#[inline(always)]
pub(super) fn plain_number_end(input: &[u8], at: usize) -> Option<usize> {
    let negative = input[at] == b'-';
    let int_start = at + usize::from(negative);
    let int_end = digits_end(input, int_start);
    let int_len = int_end - int_start;
    if int_len == 0 || int_len > 15 {
        return None;
    }
    let leading_zero = input[int_start] == b'0';
    if leading_zero && int_len > 1 {
        return None; // not JSON
    }
    match input.get(int_end) {
        Some(b'.') => {
            let frac_start = int_end + 1;
            let end = digits_end(input, frac_start);
            let frac_len = end - frac_start;
            // No digit, a trailing zero, or an exponent: not plain.
            if frac_len == 0
                || input[end - 1] == b'0'
                || matches!(input.get(end), Some(b'e' | b'E'))
            {
                return None;
            }
            let significant = if leading_zero {
                // 0.000001 (1e-6) is the smallest ECMAScript prints plain.
                let zeros = input[frac_start..end]
                    .iter()
                    .take_while(|&&b| b == b'0')
                    .count();
                if zeros > 5 {
                    return None;
                }
                frac_len - zeros
            } else {
                int_len + frac_len
            };
            // At most 15 significant digits, and not zero (the last digit is
            // not 0): the unique shortest form of the double nearest to it
            // (see `short_decimal`), and so its canonical form.
            (significant <= 15).then_some(end)
        }
        Some(b'e' | b'E') => None,
        // -0 prints as 0.
        _ if negative && leading_zero => None,
        // Below 2^53 and without leading zeros: the source is canonical.
        _ => Some(int_end),
    }
}

impl FastCanonical<'_, '_> {
    /// A number: its source text when that is its canonical form (see
    /// [`plain_number_end`]), else [`Self::general_number`].
    pub(super) fn number(&mut self) -> Option<()> {
        match plain_number_end(self.input, self.at) {
            Some(end) => {
                append(&mut self.buf.out, self.input, self.at, end);
                self.at = end;
                Some(())
            }
            None => self.general_number(),
        }
    }

    fn general_number(&mut self) -> Option<()> {
        let input = self.input;
        let begin = self.at;
        let mut i = begin;
        let negative = input[i] == b'-';
        if negative {
            i += 1;
        }
        // Significant digits (leading zeros dropped, at most 18 kept) and the
        // decimal exponent of the last one kept.
        let mut significand = 0u64;
        let mut kept = 0usize;
        let mut dropped = 0i32; // integer digits past the 18 kept
        let mut exponent = 0i32;
        let int_start = i;
        while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
            if significand == 0 && b == b'0' {
                // a leading zero: not significant
            } else if kept < 18 {
                significand = significand * 10 + u64::from(b - b'0');
                kept += 1;
            } else {
                dropped += 1;
            }
            i += 1;
        }
        let int_len = i - int_start;
        // JSON: at least one digit, and no leading zero before another digit.
        if int_len == 0 || (int_len > 1 && input[int_start] == b'0') {
            return None;
        }
        let mut integral = true;
        if input.get(i) == Some(&b'.') {
            i += 1;
            let frac_start = i;
            while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
                if significand == 0 && b == b'0' {
                    exponent -= 1;
                } else if kept < 18 {
                    significand = significand * 10 + u64::from(b - b'0');
                    kept += 1;
                    exponent -= 1;
                } else {
                    kept += 1; // more than 18 digits: the exact path below
                }
                i += 1;
            }
            if i == frac_start {
                return None;
            }
            integral = false;
        }
        if let Some(b'e' | b'E') = input.get(i) {
            i += 1;
            let exp_negative = match input.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let exp_start = i;
            let mut e = 0i32;
            while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
                e = e.saturating_mul(10).saturating_add(i32::from(b - b'0'));
                i += 1;
            }
            if i == exp_start {
                return None;
            }
            exponent = exponent.saturating_add(if exp_negative { -e } else { e });
            integral = false;
        }
        self.at = i;
        let out = &mut self.buf.out;
        if integral {
            // Up to 18 digits fits u64 (and i64 when negative), as serde_json reads it.
            if int_len > 18 {
                return None;
            }
            if int_len <= 15 && significand != 0 {
                // Below 2^53 and without leading zeros: the source is canonical.
                out.extend_from_slice(&input[begin..i]);
            } else {
                write_integer_or_double(out, significand, negative);
            }
            return Some(());
        }
        if significand == 0 && kept == 0 {
            // Any spelling of zero (0.0, -0e5): ECMAScript prints "0".
            out.push(b'0');
            return Some(());
        }
        // A decimal of at most 15 significant digits well inside the normal
        // range is the unique shortest form of the double nearest to it (see
        // `short_decimal`): its digits are the canonical ones.
        let exponent = exponent.saturating_add(dropped);
        if kept <= 15 && dropped == 0 {
            let mut int_buf = [0u8; 20];
            let digits = itoa_u64(significand, &mut int_buf);
            let trailing = digits.iter().rev().take_while(|&&b| b == b'0').count();
            let digits = &digits[..digits.len() - trailing];
            // Scientific exponent of the first digit.
            // Saturating: the exponent may already sit at i32's bounds (1e4007379511).
            let first = exponent
                .saturating_add((digits.len() + trailing) as i32)
                .saturating_sub(1);
            if (-290..=290).contains(&first) {
                // A plain decimal with no exponent and no trailing zero that
                // ECMAScript also prints in plain notation is already canonical.
                let plain = !input[begin..i].contains(&b'e')
                    && !input[begin..i].contains(&b'E')
                    && input[i - 1] != b'0'
                    && (-6..=20).contains(&first);
                if plain {
                    out.extend_from_slice(&input[begin..i]);
                    return Some(());
                }
                if negative {
                    out.push(b'-');
                }
                write_es6_digits(out, digits, first);
                return Some(());
            }
        }
        // Anything else: correctly rounded, as serde_json's `float_roundtrip`.
        let text = std::str::from_utf8(&input[begin..i]).ok()?;
        let v: f64 = text.parse().ok()?;
        if !v.is_finite() {
            return None;
        }
        write_es6_number(out, v);
        Some(())
    }
}
