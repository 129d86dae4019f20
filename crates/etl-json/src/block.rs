//! Classifying JSON text a block of [`BLOCK`] bytes at a time: which
//! bytes end a run of plain string content (quotes, backslashes, control
//! characters below 0x20), and which are not whitespace, as bit masks
//! (bit `n` for the block's byte `n`).
//!
//! With SSE2 only: on x86 and x86_64 targets that have it
//! (`target_feature = "sse2"`, part of the x86_64 baseline and of i686's;
//! no run-time detection). Elsewhere the module holds nothing but its
//! tests, and the checking pass is the code it was before blocks
//! (`check.rs`: the eight-byte word scan, the byte loop). A scalar
//! classifier with the same masks, written a byte at a time, is what the
//! tests hold the SSE2 one to. Only whole blocks are classified: the
//! callers handle the last bytes of a text, fewer than a block, with
//! their scalar code, so nothing is ever read past the end of the text.
//!
//! This is the crate's only module with `unsafe` code (the `sse2`
//! module alone allows it): one unaligned load, of a `&[u8; BLOCK]`
//! whose type proves it can be read whole, and intrinsics on registers.
//! The measured reason is in `docs/benchmarks.md` ("The checking pass on
//! blocks of 16 bytes").

/// How many bytes one classification reads.
pub(crate) const BLOCK: usize = 16;

/// The bytes of `block` that end a run of plain string content: a
/// quote, a backslash or a control character.
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
#[inline(always)]
pub(crate) fn string_stops(block: &[u8; BLOCK]) -> u32 {
    sse2::string_stops(block)
}

/// The bytes of `block` that are not JSON whitespace (space, tab, line
/// feed, carriage return).
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
#[inline(always)]
pub(crate) fn not_whitespace(block: &[u8; BLOCK]) -> u32 {
    sse2::not_whitespace(block)
}

/// SSE2: sixteen bytes compared at once, the results' high bits gathered
/// by `movemask`.
///
/// The intrinsics are `unsafe` to call from a function without
/// `#[target_feature(enable = "sse2")]`, even where the target has SSE2:
/// each call below is in its own block, and all but the load only
/// compute on values in registers. The module is compiled only where
/// `target_feature = "sse2"` is set, so the instructions exist on every
/// processor the code runs on.
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
#[allow(unsafe_code)]
mod sse2 {
    #[cfg(target_arch = "x86")]
    use std::arch::x86::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    use super::BLOCK;

    #[inline(always)]
    fn load(block: &[u8; BLOCK]) -> __m128i {
        // SAFETY: `block` is a reference to `BLOCK` (16) initialised
        // bytes, so the 16 bytes `_mm_loadu_si128` reads are all inside
        // it; the load has no alignment requirement; the module is
        // compiled only with `target_feature = "sse2"`, so the
        // instruction exists on every processor this code runs on.
        unsafe { _mm_loadu_si128(block.as_ptr().cast::<__m128i>()) }
    }

    /// The bytes of `v` equal to `byte`.
    #[inline(always)]
    fn eq(v: __m128i, byte: u8) -> __m128i {
        // SAFETY: compiled only with `target_feature = "sse2"`; both
        // operate on registers only.
        unsafe { _mm_cmpeq_epi8(v, _mm_set1_epi8(byte as i8)) }
    }

    /// The bytes of `v` below 0x20: those whose maximum with 0x1f is
    /// 0x1f (an unsigned comparison, which SSE2 has only as `max`).
    #[inline(always)]
    fn control(v: __m128i) -> __m128i {
        // SAFETY: compiled only with `target_feature = "sse2"`; all three
        // operate on registers only.
        unsafe {
            let bound = _mm_set1_epi8(0x1f);
            _mm_cmpeq_epi8(_mm_max_epu8(v, bound), bound)
        }
    }

    /// The bytes set in `a` or in `b`.
    #[inline(always)]
    fn or(a: __m128i, b: __m128i) -> __m128i {
        // SAFETY: compiled only with `target_feature = "sse2"`; registers
        // only.
        unsafe { _mm_or_si128(a, b) }
    }

    /// The bytes set in `v`, one bit each (the low 16 bits).
    #[inline(always)]
    fn mask(v: __m128i) -> u32 {
        // SAFETY: compiled only with `target_feature = "sse2"`; registers
        // only.
        unsafe { _mm_movemask_epi8(v) as u32 }
    }

    #[inline(always)]
    fn whitespace(v: __m128i) -> __m128i {
        or(
            or(eq(v, b' '), eq(v, b'\t')),
            or(eq(v, b'\n'), eq(v, b'\r')),
        )
    }

    #[inline(always)]
    pub(super) fn string_stops(block: &[u8; BLOCK]) -> u32 {
        let v = load(block);
        mask(or(or(eq(v, b'"'), eq(v, b'\\')), control(v)))
    }

    #[inline(always)]
    pub(super) fn not_whitespace(block: &[u8; BLOCK]) -> u32 {
        !mask(whitespace(load(block))) & 0xffff
    }
}

/// A byte at a time: what the SSE2 classifier is held to, itself held to
/// the bytes (a test's, on every target).
#[cfg(test)]
mod scalar {
    use super::BLOCK;

    /// The mask of the bytes of `block` for which `class` holds.
    fn mask(block: &[u8; BLOCK], class: impl Fn(u8) -> bool) -> u32 {
        block
            .iter()
            .enumerate()
            .fold(0, |m, (n, &c)| m | u32::from(class(c)) << n)
    }

    fn is_whitespace(c: u8) -> bool {
        matches!(c, b' ' | b'\t' | b'\n' | b'\r')
    }

    pub(super) fn string_stops(block: &[u8; BLOCK]) -> u32 {
        mask(block, |c| c == b'"' || c == b'\\' || c < 0x20)
    }

    pub(super) fn not_whitespace(block: &[u8; BLOCK]) -> u32 {
        mask(block, |c| !is_whitespace(c))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The masks of `block` written out once more, byte by byte, and
    /// each classifier's held to them (the SSE2 one where it is
    /// compiled).
    fn check(block: &[u8; BLOCK]) {
        let (mut stops, mut not_whitespace) = (0, 0);
        for (n, &c) in block.iter().enumerate() {
            if c == b'"' || c == b'\\' || c < 0x20 {
                stops |= 1 << n;
            }
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                not_whitespace |= 1 << n;
            }
        }
        assert_eq!(scalar::string_stops(block), stops, "{block:?}");
        assert_eq!(scalar::not_whitespace(block), not_whitespace, "{block:?}");
        #[cfg(all(
            any(target_arch = "x86", target_arch = "x86_64"),
            target_feature = "sse2"
        ))]
        {
            assert_eq!(string_stops(block), stops, "{block:?}");
            assert_eq!(super::not_whitespace(block), not_whitespace, "{block:?}");
        }
    }

    #[test]
    fn every_byte_is_classified_at_every_place() {
        for byte in 0..=255u8 {
            for at in 0..BLOCK {
                let mut block = *b"abcdefghijklmnop";
                block[at] = byte;
                check(&block);
                // Among bytes of every class, and filling the block.
                let mut busy = *b"{\"a\\\"\t: [1,\x01\r\n]}";
                busy[at] = byte;
                check(&busy);
            }
            check(&[byte; BLOCK]);
        }
    }

    proptest! {
        #[test]
        fn prop_the_classifier_agrees_with_the_bytes(block in any::<[u8; BLOCK]>()) {
            check(&block);
        }
    }
}
