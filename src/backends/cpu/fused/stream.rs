//! Writing a large output with streaming (non-temporal) stores, and the
//! fence that publishes them: a fused kernel's output past the streaming
//! threshold (`STREAM_BYTES` in `run.rs`) cannot stay in cache, so it is
//! written without first being read in.

use super::super::storage::Elem;

/// Copies `src` into `dst` with non-temporal (streaming) stores where the
/// CPU has them, so a large output is written without first being read
/// into the cache, and without evicting what the kernel still reads; the
/// caller fences (`stream_fence`) before anyone else reads `dst`. The
/// element types kernels write are plain bytes (numbers and `bool`), so a
/// byte copy is a copy.
pub(super) fn stream_copy<T: Elem>(dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len()) * std::mem::size_of::<T>();
    // SAFETY: both ranges are `n` bytes of live slices (`&mut` and `&`, so
    // disjoint); every `T` here is plain data, any byte copy of which is valid.
    let (d, s) = unsafe {
        (
            std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), n),
            std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), n),
        )
    };
    #[cfg(target_arch = "x86_64")]
    {
        #[cfg(not(miri))]
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = d.as_ptr().align_offset(16).min(n);
        d[..head].copy_from_slice(&s[..head]);
        let body = (n - head) / 16 * 16;
        for i in (head..head + body).step_by(16) {
            // SAFETY: `i..i + 16` is inside both slices, and `d + i` is
            // 16-byte aligned (`head` aligned it); SSE2 is baseline x86_64.
            #[cfg(not(miri))]
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().add(i).cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().add(i).cast::<__m128i>(), v);
            }
            // Miri cannot run the streaming store (inline assembly); it
            // checks the same ranges as plain copies.
            #[cfg(miri)]
            d[i..i + 16].copy_from_slice(&s[i..i + 16]);
        }
        d[head + body..].copy_from_slice(&s[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    d.copy_from_slice(s);
}

/// Orders this thread's streaming stores before its later stores (so the
/// task's completion, which rayon publishes, comes after its output).
pub(super) fn stream_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SSE2 is baseline on x86_64; a fence has no other effect.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    // Miri has no `sfence`; a release fence is what its memory model checks.
    #[cfg(miri)]
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every head and tail length around the 16-byte stores, for element
    /// sizes 1, 4 and 8.
    #[test]
    fn stream_copy_copies_every_element_at_any_alignment() {
        let src: Vec<f64> = (0..100).map(|i| i as f64 * 1.5 - 7.0).collect();
        let f32s: Vec<f32> = src.iter().map(|&v| v as f32).collect();
        let bytes: Vec<u8> = (0..100).map(|i| (i * 37 % 251) as u8).collect();
        for start in 0..5 {
            for len in [0, 1, 3, 4, 5, 15, 16, 17, 33, 64, 95 - start] {
                let mut d = vec![0f64; 100];
                stream_copy(&mut d[start..start + len], &src[start..start + len]);
                let mut e = vec![0f32; 100];
                stream_copy(&mut e[start..start + len], &f32s[start..start + len]);
                let mut b = [0u8; 100];
                stream_copy(&mut b[start..start + len], &bytes[start..start + len]);
                stream_fence();
                for i in 0..100 {
                    let inside = (start..start + len).contains(&i);
                    assert_eq!(d[i], if inside { src[i] } else { 0.0 }, "f64 {start}+{len} at {i}");
                    assert_eq!(e[i], if inside { f32s[i] } else { 0.0 }, "f32 {start}+{len} at {i}");
                    assert_eq!(b[i], if inside { bytes[i] } else { 0 }, "u8 {start}+{len} at {i}");
                }
            }
        }
    }
}
