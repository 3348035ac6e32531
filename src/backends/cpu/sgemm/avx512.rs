//! The 6x32 register kernel for CPUs with AVX-512F: two 16-column B
//! slivers side by side, one 512-bit register per sliver row, so each
//! fused multiply-add does the work of two of the AVX2 kernel's.
//!
//! # Why inline assembly
//!
//! Rust's AVX-512 intrinsics and the `avx512f` target feature are stable
//! since 1.89; kiln's rust-version is 1.85 (the newest Cranelift that
//! builds with it is pinned for that). `asm!` is stable since 1.59, and the
//! assembler takes AVX-512 instructions in any function. The block names
//! only `zmm0`-`zmm15`, whose low halves (`xmm0`-`xmm15`) it declares
//! clobbered: naming `zmm16`-`zmm31` needs the target feature, so the
//! kernel keeps to sixteen registers (twelve accumulators, two B rows,
//! two broadcasts of A). It ends with `vzeroupper`, so the SSE code
//! around it pays no transition.
//!
//! # Measured (single thread, Xeon with AVX-512, one core's peak 232
//! GFLOP/s in zmm FMAs, 126 in ymm)
//!
//! Slivers in L1, the kernel alone: 175-187 GFLOP/s against the AVX2
//! kernel's 110-117. In the GEMM at MiniLM's shapes (1024 rows, `w.t()`):
//! 146-157 against 98-104. Broadcasting A from memory inside each FMA
//! (`{1to16}`, two loads per row) measured 5-10% slower than one
//! `vbroadcastss` per row.
//!
//! # Results
//!
//! Each element is the same chain of fused multiply-adds over `p` in
//! order, from zero, as the AVX2 kernel's, then added to C when
//! accumulating: the two kernels give the same bits (tested).

/// True when this CPU (and its OS, which must save the 512-bit state) can
/// run [`kernel_6x32`].
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && super::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Zeroes the twelve accumulators: row r is zmm(2r) (columns 0-15) and
/// zmm(2r+1) (16-31). A VEX xor zeroes the whole register.
#[cfg(target_arch = "x86_64")]
macro_rules! zero_accumulators {
    () => {
        concat!(
            "vxorps xmm0, xmm0, xmm0\n",
            "vxorps xmm1, xmm1, xmm1\n",
            "vxorps xmm2, xmm2, xmm2\n",
            "vxorps xmm3, xmm3, xmm3\n",
            "vxorps xmm4, xmm4, xmm4\n",
            "vxorps xmm5, xmm5, xmm5\n",
            "vxorps xmm6, xmm6, xmm6\n",
            "vxorps xmm7, xmm7, xmm7\n",
            "vxorps xmm8, xmm8, xmm8\n",
            "vxorps xmm9, xmm9, xmm9\n",
            "vxorps xmm10, xmm10, xmm10\n",
            "vxorps xmm11, xmm11, xmm11",
        )
    };
}

/// The accumulators' six rows added to C's (when `{acc}` is not zero)
/// and stored, 32 floats a row `{ldc}` bytes apart from `{c}` (`{c3}`
/// is row 3), then `vzeroupper`.
#[cfg(target_arch = "x86_64")]
macro_rules! store_accumulators {
    () => {
        concat!(
            "lea {c3}, [{c} + 2*{ldc}]\n",
            "add {c3}, {ldc}\n",
            "test {acc}, {acc}\n",
            "jz 4f\n",
            "vaddps zmm0, zmm0, zmmword ptr [{c}]\n",
            "vaddps zmm1, zmm1, zmmword ptr [{c} + 64]\n",
            "vaddps zmm2, zmm2, zmmword ptr [{c} + {ldc}]\n",
            "vaddps zmm3, zmm3, zmmword ptr [{c} + {ldc} + 64]\n",
            "vaddps zmm4, zmm4, zmmword ptr [{c} + 2*{ldc}]\n",
            "vaddps zmm5, zmm5, zmmword ptr [{c} + 2*{ldc} + 64]\n",
            "vaddps zmm6, zmm6, zmmword ptr [{c3}]\n",
            "vaddps zmm7, zmm7, zmmword ptr [{c3} + 64]\n",
            "vaddps zmm8, zmm8, zmmword ptr [{c3} + {ldc}]\n",
            "vaddps zmm9, zmm9, zmmword ptr [{c3} + {ldc} + 64]\n",
            "vaddps zmm10, zmm10, zmmword ptr [{c3} + 2*{ldc}]\n",
            "vaddps zmm11, zmm11, zmmword ptr [{c3} + 2*{ldc} + 64]\n",
            "4:\n",
            "vmovups zmmword ptr [{c}], zmm0\n",
            "vmovups zmmword ptr [{c} + 64], zmm1\n",
            "vmovups zmmword ptr [{c} + {ldc}], zmm2\n",
            "vmovups zmmword ptr [{c} + {ldc} + 64], zmm3\n",
            "vmovups zmmword ptr [{c} + 2*{ldc}], zmm4\n",
            "vmovups zmmword ptr [{c} + 2*{ldc} + 64], zmm5\n",
            "vmovups zmmword ptr [{c3}], zmm6\n",
            "vmovups zmmword ptr [{c3} + 64], zmm7\n",
            "vmovups zmmword ptr [{c3} + {ldc}], zmm8\n",
            "vmovups zmmword ptr [{c3} + {ldc} + 64], zmm9\n",
            "vmovups zmmword ptr [{c3} + 2*{ldc}], zmm10\n",
            "vmovups zmmword ptr [{c3} + 2*{ldc} + 64], zmm11\n",
            "vzeroupper",
        )
    };
}

/// One step of `p`: B's two 16-float rows at byte offset `$b` (and
/// `$b + next`), A's six floats at byte offsets `$a0`..`$a5`, each
/// broadcast and multiplied into its row's two accumulators.
#[cfg(target_arch = "x86_64")]
macro_rules! step {
    ($b:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal, $a4:literal, $a5:literal) => {
        concat!(
            "vmovups zmm12, zmmword ptr [{b} + ",
            $b,
            "]\n",
            "vmovups zmm13, zmmword ptr [{b} + {next} + ",
            $b,
            "]\n",
            "vbroadcastss zmm14, dword ptr [{a} + ",
            $a0,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a} + ",
            $a1,
            "]\n",
            "vfmadd231ps zmm0, zmm12, zmm14\n",
            "vfmadd231ps zmm1, zmm13, zmm14\n",
            "vfmadd231ps zmm2, zmm12, zmm15\n",
            "vfmadd231ps zmm3, zmm13, zmm15\n",
            "vbroadcastss zmm14, dword ptr [{a} + ",
            $a2,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a} + ",
            $a3,
            "]\n",
            "vfmadd231ps zmm4, zmm12, zmm14\n",
            "vfmadd231ps zmm5, zmm13, zmm14\n",
            "vfmadd231ps zmm6, zmm12, zmm15\n",
            "vfmadd231ps zmm7, zmm13, zmm15\n",
            "vbroadcastss zmm14, dword ptr [{a} + ",
            $a4,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a} + ",
            $a5,
            "]\n",
            "vfmadd231ps zmm8, zmm12, zmm14\n",
            "vfmadd231ps zmm9, zmm13, zmm14\n",
            "vfmadd231ps zmm10, zmm12, zmm15\n",
            "vfmadd231ps zmm11, zmm13, zmm15",
        )
    };
}

/// `C (+)= A_sliver x [B_sliver, B_next]` over `kc`: a 6-row A sliver
/// (`kc * 6` floats) against two 16-column B slivers, the second
/// `next` floats after the first, into 6 rows of 32 floats of C at row
/// stride `ldc`.
///
/// # Safety
/// `a` has `kc * 6` readable floats, `b` and `b + next` `kc * 16` each;
/// `c` has 6 rows of 32 writable floats `ldc` apart; [`available`] is true.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_6x32(
    kc: usize,
    a: *const f32,
    b: *const f32,
    next: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::asm;
    // Fetch C's six rows (2 x 64 bytes each) now, so the stores at the
    // end do not wait on memory (as the AVX2 kernel does).
    for r in 0..6 {
        // SAFETY: a prefetch never faults; the addresses are row r.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let row = c.add(r * ldc).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.add(64));
        }
    }
    // SAFETY: the loop reads `kc` rows of 6 floats from `a` and of 16 from
    // `b` and `b + next`, and the epilogue reads (when accumulating) and
    // writes 6 rows of 32 floats at `c`, `ldc` apart: all inside the
    // caller's buffers. Only zmm0-15 (declared through xmm0-15) and the
    // named general registers change; `vzeroupper` clears the upper
    // halves before returning.
    unsafe {
        asm!(
            zero_accumulators!(),
            // Four steps of `p` an iteration, then one at a time. The A
            // sliver streams from L2 (B's two stay in L1): ask for its
            // line 16 steps ahead (past its end, the next sliver's, which
            // the tile reads next; a prefetch never faults). A few percent
            // of the kernel on the encoder's shapes, as is the unrolling.
            "cmp {kc}, 4",
            "jb 5f",
            "6:",
            "prefetcht0 [{a} + 384]",
            step!("0", "0", "4", "8", "12", "16", "20"),
            step!("64", "24", "28", "32", "36", "40", "44"),
            step!("128", "48", "52", "56", "60", "64", "68"),
            step!("192", "72", "76", "80", "84", "88", "92"),
            "add {a}, 96",
            "add {b}, 256",
            "sub {kc}, 4",
            "cmp {kc}, 4",
            "jae 6b",
            "5:",
            "test {kc}, {kc}",
            "jz 3f",
            "2:",
            step!("0", "0", "4", "8", "12", "16", "20"),
            "add {a}, 24",
            "add {b}, 64",
            "dec {kc}",
            "jnz 2b",
            "3:",
            store_accumulators!(),
            kc = inout(reg) kc => _,
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            next = in(reg) next * 4,
            c = in(reg) c,
            ldc = in(reg) ldc * 4,
            acc = in(reg) usize::from(accumulate),
            c3 = out(reg) _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            options(nostack),
        );
    }
}

/// One step of `p` of [`kernel_6x32_rows`]: B's two 16-float rows at byte
/// offset `$b` (and `$b + next`), then A's six rows, each at byte offset
/// `$a` of its own row (`{a}`, `{a} + lda`, `{a} + 2 lda`, and the same
/// from `{a3}`, row 3), broadcast and multiplied into its accumulators.
#[cfg(target_arch = "x86_64")]
macro_rules! step_rows {
    ($b:literal, $a:literal) => {
        concat!(
            "vmovups zmm12, zmmword ptr [{b} + ",
            $b,
            "]\n",
            "vmovups zmm13, zmmword ptr [{b} + {next} + ",
            $b,
            "]\n",
            "vbroadcastss zmm14, dword ptr [{a} + ",
            $a,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a} + {lda} + ",
            $a,
            "]\n",
            "vfmadd231ps zmm0, zmm12, zmm14\n",
            "vfmadd231ps zmm1, zmm13, zmm14\n",
            "vfmadd231ps zmm2, zmm12, zmm15\n",
            "vfmadd231ps zmm3, zmm13, zmm15\n",
            "vbroadcastss zmm14, dword ptr [{a} + 2*{lda} + ",
            $a,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a3} + ",
            $a,
            "]\n",
            "vfmadd231ps zmm4, zmm12, zmm14\n",
            "vfmadd231ps zmm5, zmm13, zmm14\n",
            "vfmadd231ps zmm6, zmm12, zmm15\n",
            "vfmadd231ps zmm7, zmm13, zmm15\n",
            "vbroadcastss zmm14, dword ptr [{a3} + {lda} + ",
            $a,
            "]\n",
            "vbroadcastss zmm15, dword ptr [{a3} + 2*{lda} + ",
            $a,
            "]\n",
            "vfmadd231ps zmm8, zmm12, zmm14\n",
            "vfmadd231ps zmm9, zmm13, zmm14\n",
            "vfmadd231ps zmm10, zmm12, zmm15\n",
            "vfmadd231ps zmm11, zmm13, zmm15",
        )
    };
}

/// [`kernel_6x32`] with A read where it lies instead of packed: six rows
/// of `kc` adjacent floats, `lda` floats apart (a weight's rows, in the
/// transposed products of `transposed.rs`). Each of the six is a
/// sequential stream, so nothing is gained by copying them into a sliver
/// first. The same chain of multiply-adds per element as `kernel_6x32`
/// (and the same bits).
///
/// # Safety
/// `a + r * lda` has `kc` readable floats for each row `r < 6`; `b` and
/// `b + next` have `kc * 16` each; `c` has 6 rows of 32 writable floats
/// `ldc` apart; [`available`] is true.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_6x32_rows(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    next: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::asm;
    // SAFETY: as `kernel_6x32`'s, with A's six rows read at `a + r * lda`
    // (`r < 6`), `kc` floats each: inside the caller's buffer.
    unsafe {
        asm!(
            zero_accumulators!(),
            "lea {a3}, [{a} + 2*{lda}]",
            "add {a3}, {lda}",
            "cmp {kc}, 4",
            "jb 5f",
            "6:",
            step_rows!("0", "0"),
            step_rows!("64", "4"),
            step_rows!("128", "8"),
            step_rows!("192", "12"),
            "add {a}, 16",
            "add {a3}, 16",
            "add {b}, 256",
            "sub {kc}, 4",
            "cmp {kc}, 4",
            "jae 6b",
            "5:",
            "test {kc}, {kc}",
            "jz 3f",
            "2:",
            step_rows!("0", "0"),
            "add {a}, 4",
            "add {a3}, 4",
            "add {b}, 64",
            "dec {kc}",
            "jnz 2b",
            "3:",
            store_accumulators!(),
            kc = inout(reg) kc => _,
            a = inout(reg) a => _,
            lda = in(reg) lda * 4,
            b = inout(reg) b => _,
            next = in(reg) next * 4,
            c = in(reg) c,
            ldc = in(reg) ldc * 4,
            acc = in(reg) usize::from(accumulate),
            a3 = out(reg) _,
            c3 = out(reg) _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            options(nostack),
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_6x32_rows(
    _: usize,
    _: *const f32,
    _: usize,
    _: *const f32,
    _: usize,
    _: *mut f32,
    _: usize,
    _: bool,
) {
    unreachable!("the AVX-512 kernel is only called where `available()`")
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn kernel_6x32(
    _: usize,
    _: *const f32,
    _: *const f32,
    _: usize,
    _: *mut f32,
    _: usize,
    _: bool,
) {
    unreachable!("the AVX-512 kernel is only called where `available()`")
}
