//! Decisions drawn from a fuzzer's bytes, as `arbitrary::Unstructured`
//! draws them: each call consumes a few bytes, and once they run out every
//! decision is the first option, so any input — empty included — is a
//! complete, deterministic list of mutations.

/// A cursor over the bytes that choose the mutations.
pub struct Choices<'a> {
    bytes: &'a [u8],
}

impl<'a> Choices<'a> {
    /// Decisions from `bytes`, first to last.
    pub fn new(bytes: &'a [u8]) -> Choices<'a> {
        Choices { bytes }
    }

    /// Whether every byte has been used.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A number from the next eight bytes (fewer at the end), little-endian.
    pub fn u64(&mut self) -> u64 {
        let n = self.bytes.len().min(8);
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head.iter().rev().fold(0, |acc, &b| (acc << 8) | u64::from(b))
    }

    /// A number in `0..n` (0 when `n` is 0), from as few bytes as `n` needs.
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let width = (usize::BITS - (n - 1).leading_zeros()).div_ceil(8) as usize;
        let take = self.bytes.len().min(width);
        let (head, rest) = self.bytes.split_at(take);
        self.bytes = rest;
        let raw = head.iter().rev().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        raw % n
    }

    /// One of `options`, which must not be empty.
    pub fn pick<'o, T>(&mut self, options: &'o [T]) -> &'o T {
        &options[self.below(options.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::Choices;

    #[test]
    fn decisions_stay_in_range_and_default_to_the_first_option_when_bytes_run_out() {
        let mut c = Choices::new(&[0xff, 0xff, 7]);
        assert_eq!(c.below(1000), 0xffff % 1000);
        assert_eq!(c.below(3), 1);
        assert!(c.is_empty());
        assert_eq!(c.below(5), 0);
        assert_eq!(c.u64(), 0);
        assert_eq!(*c.pick(&["a", "b"]), "a");
    }
}
