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

/// The end of the number at `at` when its source text is its canonical form
/// (see [`write_number_literal`]): a plain integer of at most 21 digits, or a
/// plain decimal with no trailing zero that ECMAScript prints without an
/// exponent (at least 1e-6, integer part of at most 21 digits). `None` for
/// anything else, valid or not.
#[inline(always)]
pub(super) fn plain_number_end(input: &[u8], at: usize) -> Option<usize> {
    let negative = input[at] == b'-';
    let int_start = at + usize::from(negative);
    let int_end = digits_end(input, int_start);
    let int_len = int_end - int_start;
    if int_len == 0 || int_len > 21 {
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
            // 0.000001 (1e-6) is the smallest ECMAScript prints plain.
            let plain = !leading_zero
                || input[frac_start..end]
                    .iter()
                    .take_while(|&&b| b == b'0')
                    .count()
                    <= 5;
            plain.then_some(end)
        }
        Some(b'e' | b'E') => None,
        // An integer without leading zeros (or -0) is its own canonical layout.
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

    /// Any other number in JSON's grammar: its exact value, laid out as
    /// ECMAScript would (see [`write_number_literal`]).
    fn general_number(&mut self) -> Option<()> {
        let input = self.input;
        let begin = self.at;
        let int_start = begin + usize::from(input[begin] == b'-');
        let mut i = digits_end(input, int_start);
        let int_len = i - int_start;
        // At least one digit, and no leading zero before another digit.
        if int_len == 0 || (int_len > 1 && input[int_start] == b'0') {
            return None;
        }
        if input.get(i) == Some(&b'.') {
            let frac_start = i + 1;
            i = digits_end(input, frac_start);
            if i == frac_start {
                return None;
            }
        }
        if let Some(b'e' | b'E') = input.get(i) {
            i += 1;
            if let Some(b'-' | b'+') = input.get(i) {
                i += 1;
            }
            let exp_start = i;
            i = digits_end(input, exp_start);
            if i == exp_start {
                return None;
            }
        }
        write_number_literal(&mut self.buf.out, &input[begin..i])?;
        self.at = i;
        Some(())
    }
}
