//! What the tensor-core attention kernels (`attention_mma.rs`, forward;
//! `attention_grad.rs`, backward) share: 64-row tiles of an operand in
//! shared memory, the loop that walks the other side's tiles, and the
//! warp-wide products that read them.
//!
//! - **Tiles** sit row-major with rows padded by 8 elements, so a row
//!   starts 16-byte aligned and the 8 rows an `ldmatrix` phase reads fall
//!   in distinct banks (a row of 64 + 8 halves is 36 words).
//! - **The tile loop** ([`tile_loop`]) loads a tile of each operand per
//!   iteration. Where every operand is read 16 bytes at a time and two
//!   sets of tiles fit the 48 KiB of static shared memory, it is
//!   double-buffered: the next iteration's tiles are requested with
//!   `cp.async` before this iteration's products, so their latency hides
//!   under the arithmetic (FlashAttention-2's pipeline); otherwise the
//!   loads and the products alternate behind barriers.
//! - **Products** read their B operand with `ldmatrix`: along the rows
//!   ([`mma_rows`]: keys for `S = q kᵀ`) four 8 × 8 tiles a load, which
//!   feed two `mma`s (two 32-bit loads an `mma` before), and down the
//!   columns ([`mma_columns`]: values for `p v`) with `.trans`.

use super::attention::Strided;
use super::Kernel;
use std::fmt::Write;

/// Rows of a tile (and of the rows a block owns: 16 per warp).
pub(super) const TILE: usize = 64;
/// Threads of a block.
pub(super) const THREADS: usize = 128;
/// Padding of a shared-memory row, in elements.
pub(super) const PAD: usize = 8;
/// Shared memory a block's tiles and the kernel's other arrays may take:
/// past the 48 KiB of static shared memory, the tiles are sized at launch
/// ([`declare`]). Two buffers of keys and values at head dim 128 are 68
/// KiB: with static shared memory only, they loaded and computed in turn.
pub(super) const SMEM_BYTES: usize = Kernel::OPT_IN_SHARED as usize;

/// Whether an operand's rows of `n` head-dim elements can be read 8 at a
/// time (16 bytes, aligned: buffers are 64-byte aligned).
pub(crate) fn vectorized(x: &Strided, n: usize) -> bool {
    x.strides[3] == 1 && n % 8 == 0 && x.offset % 8 == 0 && x.strides[..3].iter().all(|s| s % 8 == 0)
}

/// One operand loaded a tile per iteration of a [`tile_loop`]: rows of
/// `n` elements of `x` (the kernel parameter) into the shared array
/// `smem` (rows of `n + PAD`).
pub(super) struct Tile<'a> {
    pub smem: &'static str,
    pub x: &'static str,
    pub strided: &'a Strided,
    pub n: usize,
    /// Rows that exist, if not the loop's length: rows past it load as
    /// zeros.
    pub len: Option<usize>,
}

impl Tile<'_> {
    fn stride(&self) -> usize {
        self.n + PAD
    }
}

/// Whether a loop over `tiles` (beside `other` elements of shared memory
/// the kernel declares) runs double-buffered (see the module docs).
pub(super) fn pipelined(tiles: &[Tile<'_>], other_bytes: usize) -> bool {
    let bytes: usize = tiles.iter().map(|t| 2 * 2 * TILE * t.stride()).sum();
    tiles.iter().all(|t| vectorized(t.strided, t.n)) && bytes + other_bytes <= SMEM_BYTES
}

/// Declares the shared array of each tile, twice as long when
/// `pipelined`. The first [`TILE`] rows (`smem[r * (n + PAD) + c]`) may
/// stage an operand before the loop. Where they and the kernel's
/// `other_bytes` of static arrays outgrow static shared memory, the tiles
/// are carved from one array sized at launch: returns its bytes (for
/// [`Kernel::with_shared`]), else 0.
pub(super) fn declare(s: &mut String, tiles: &[Tile<'_>], pipelined: bool, other_bytes: usize) -> usize {
    let buffers = if pipelined { 2 } else { 1 };
    let elems: Vec<usize> = tiles.iter().map(|t| buffers * TILE * t.stride()).collect();
    let total: usize = elems.iter().map(|n| n.next_multiple_of(8)).sum();
    if 2 * total + other_bytes <= Kernel::STATIC_SHARED as usize {
        for (t, n) in tiles.iter().zip(&elems) {
            let _ = writeln!(s, "  __align__(16) __shared__ unsigned short {}[{n}];", t.smem);
        }
        return 0;
    }
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, tiles_smem, {total});");
    let mut at = 0;
    for (t, n) in tiles.iter().zip(&elems) {
        // Each tile starts 16-byte aligned (8 elements).
        let _ = writeln!(s, "  unsigned short* const {} = tiles_smem + {at};", t.smem);
        at += n.next_multiple_of(8);
    }
    2 * at
}

/// Code that loads rows `start .. start + 64` (zeros past `len`) of
/// operand `x` (`n` elements a row) into rows `0 .. 64` of `smem` at
/// element offset `at` (a C expression): 16 bytes a thread where the
/// operand allows it, else element by element.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_load(
    s: &mut String,
    x: &str,
    strided: &Strided,
    n: usize,
    start: &str,
    len: usize,
    smem: &str,
    at: &str,
) {
    let stride = n + PAD;
    if vectorized(strided, n) {
        let per = n / 8;
        let _ = writeln!(s, "  for (int e = t; e < {}; e += {THREADS}) {{", TILE * per);
        let _ = writeln!(s, "    const int r = e / {per}, c8 = e % {per} * 8;\n    const I j = {start} + r;");
        s.push_str("    kiln::u16x8 x8 = {{0u, 0u, 0u, 0u}};\n");
        let _ = writeln!(
            s,
            "    if (j < {len}) x8 = *(const kiln::u16x8*)&{x}[{}];",
            strided.at("b", "h", "j", "c8")
        );
        let _ = writeln!(s, "    *(kiln::u16x8*)&{smem}[{at} + r * {stride} + c8] = x8;\n  }}");
    } else {
        let _ = writeln!(s, "  for (int e = t; e < {}; e += {THREADS}) {{", TILE * n);
        let _ = writeln!(s, "    const int r = e / {n}, cc = e % {n};\n    const I j = {start} + r;");
        let _ = writeln!(
            s,
            "    {smem}[{at} + r * {stride} + cc] = j < {len} ? {x}[{}].bits : (unsigned short)0;\n  }}",
            strided.at("b", "h", "j", "cc")
        );
    }
}

/// [`tile_load`] of a vectorized operand by `cp.async` (rows past `len`
/// are zero-filled from row 0's address, which exists).
pub(super) fn tile_load_async(s: &mut String, t: &Tile<'_>, start: &str, len: usize, at: &str) {
    let (per, stride) = (t.n / 8, t.stride());
    let _ = writeln!(s, "  for (int e = t; e < {}; e += {THREADS}) {{", TILE * per);
    let _ = writeln!(s, "    const int r = e / {per}, c8 = e % {per} * 8;\n    const I j = {start} + r;");
    let _ = writeln!(
        s,
        "    kiln::cp_async16(&{}[{at} + r * {stride} + c8], &{}[{}], j < {len});\n  }}",
        t.smem,
        t.x,
        t.strided.at("b", "h", &format!("(j < {len} ? j : 0)"), "c8")
    );
}

/// Emits `for (I {var} = {start}; {var} < {end}; {var} += 64)` over the
/// tiles `tiles` (rows of length `len`): each iteration has each tile's
/// rows `var .. var + 64` in `smem` at the element offset `{smem}_o` (a
/// C int in scope for `body`), then runs `body`. `extra(s, buffer,
/// start)` adds the loop's own loads of the same rows into buffer
/// `buffer` (0 or 1, a C expression) by plain stores. Pipelined (see
/// [`pipelined`]), the loads of the next tiles are in flight during
/// `body`; else each iteration loads, then computes.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_loop(
    s: &mut String,
    var: &str,
    (start, end): (&str, &str),
    len: usize,
    tiles: &[Tile<'_>],
    pipelined: bool,
    extra: impl Fn(&mut String, &str, &str),
    body: impl FnOnce(&mut String),
) {
    let offsets = |s: &mut String, buffer: &str| {
        let parts: Vec<String> =
            tiles.iter().map(|t| format!("{}_o = {buffer} * {}", t.smem, TILE * t.stride())).collect();
        let _ = writeln!(s, "    const int {};", parts.join(", "));
    };
    if !pipelined {
        let _ = writeln!(s, "  for (I {var} = {start}; {var} < {end}; {var} += {TILE}) {{");
        s.push_str(
            "    __syncthreads();  // the previous tile's (or the staged operand's) readers are done\n",
        );
        let mut loads = String::new();
        for t in tiles {
            tile_load(&mut loads, t.x, t.strided, t.n, var, t.len.unwrap_or(len), t.smem, "0");
        }
        extra(&mut loads, "0", var);
        indent(s, "  ", &loads);
        s.push_str("    __syncthreads();\n");
        offsets(s, "0");
        body(s);
        s.push_str("  }\n");
        return;
    }
    let issue = |buffer: &str, from: &str| {
        let mut loads = String::new();
        for t in tiles {
            let at = format!("{buffer} * {}", TILE * t.stride());
            tile_load_async(&mut loads, t, from, t.len.unwrap_or(len), &at);
        }
        extra(&mut loads, buffer, from);
        loads.push_str("  kiln::cp_async_commit();\n");
        loads
    };
    s.push_str("  __syncthreads();  // the staged operand's readers are done with buffer 0\n");
    s.push_str(&issue("0", start));
    let _ =
        writeln!(s, "  int buf = 0;\n  for (I {var} = {start}; {var} < {end}; {var} += {TILE}, buf ^= 1) {{");
    let _ = writeln!(s, "    if ({var} + {TILE} < {end}) {{");
    let next = issue("(buf ^ 1)", &format!("{var} + {TILE}"));
    indent(s, "    ", &next);
    s.push_str("      kiln::cp_async_wait<1>();\n    } else {\n      kiln::cp_async_wait<0>();\n    }\n");
    s.push_str("    __syncthreads();  // this tile's copies are visible\n");
    offsets(s, "buf");
    body(s);
    s.push_str("    __syncthreads();  // its readers are done before the buffer is refilled\n  }\n");
}

/// Appends `code`, each line indented by `ind` more.
pub(super) fn indent(s: &mut String, ind: &str, code: &str) {
    for line in code.lines() {
        let _ = writeln!(s, "{ind}{line}");
    }
}

/// (At the loop body's indent.) `acc[n] = a · B(n)` for `n < count`
/// (even), `a` the A fragment array `af[kk]` over `kk < ks`, and `B(n)`
/// the 16 × 8 operand whose column `j` is row `8n + j` of the shared
/// tile at `tile` (a C pointer expression; row stride `stride`), read
/// along that row: four tiles an `ldmatrix`, two products. With `qt > 1`
/// query tiles a warp, `acc[tq][n] = af[tq] · B(n)` for each `tq < qt`: each
/// `ldmatrix` feeds `2 qt` products.
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_rows(
    s: &mut String,
    acc: &str,
    af: &str,
    count: usize,
    ks: usize,
    tile: &str,
    stride: usize,
    tag: &str,
    qt: usize,
) {
    debug_assert!(count % 2 == 0, "mma_rows pairs its column groups");
    let (acc, af) = (tiled(acc, qt), tiled(af, qt));
    let ind = "    ";
    let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int n = 0; n < {count}; n += 2) {{");
    let mut zero = String::new();
    let _ = writeln!(zero, "{acc}[n][0] = {acc}[n][1] = {acc}[n][2] = {acc}[n][3] = 0.f;");
    let _ = writeln!(zero, "{acc}[n + 1][0] = {acc}[n + 1][1] = {acc}[n + 1][2] = {acc}[n + 1][3] = 0.f;");
    each_tile(s, &format!("{ind}  "), qt, &zero);
    let _ = writeln!(s, "{ind}  #pragma unroll\n{ind}  for (int kk = 0; kk < {ks}; ++kk) {{");
    row_pair_products(s, &format!("{ind}    "), (tile, stride), &acc, &format!("{af}[kk]"), tag, qt);
    let _ = writeln!(s, "{ind}  }}\n{ind}}}");
}

/// (At indent `ind`, inside loops over `n` (column groups, by 2) and `kk`
/// (k-steps).) `acc[n] += a · B(n)` and `acc[n + 1] += a · B(n + 1)`,
/// each query tile's, with both B fragments (rows `8n .. 8n + 15` of the
/// shared tile, k-step `kk`) from one `ldmatrix`.
fn row_pair_products(
    s: &mut String,
    ind: &str,
    (tile, stride): (&str, usize),
    acc: &str,
    a: &str,
    tag: &str,
    qt: usize,
) {
    let _ = writeln!(s, "{ind}U bf[4];");
    let _ = writeln!(
        s,
        "{ind}kiln::ldsm_x4(bf, &({tile})[((n + (lane >> 4)) * 8 + (lane & 7)) * {stride} + kk * 16 + ((lane >> 3) & 1) * 8]);"
    );
    let products = format!(
        "kiln::mma_16816({acc}[n], {a}, bf, {tag});\nkiln::mma_16816({acc}[n + 1], {a}, bf + 2, {tag});\n"
    );
    each_tile(s, ind, qt, &products);
}

/// `acc[n] += A · B(n)` for `n < count`, with A the 16 × 64 tile held in
/// the accumulator array `src` (rounded to the input type: `src[2kk]`,
/// `src[2kk + 1]` are its columns `16kk .. 16kk + 15`) and `B(n)` columns
/// `8n .. 8n + 7` of the shared tile at `tile` (rows `0 .. 64`, stride
/// `stride`), read down the columns: four tiles an `ldmatrix.trans` (two
/// for a last, odd column group). With `qt > 1`, `acc[tq][n] += A[tq] ·
/// B(n)` for each of a warp's query tiles `tq`, from `src[tq]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_columns(
    s: &mut String,
    acc: &str,
    src: &str,
    count: usize,
    tile: &str,
    stride: usize,
    tag: &str,
    qt: usize,
) {
    mma_columns_of(s, (acc, src, TILE), count, tile, stride, tag, qt, "");
}

/// [`mma_columns`] with A `src`'s first `k` columns (a multiple of 16)
/// and the shared tile's first `k` rows; `after_pack` (one query tile)
/// runs where each k-step's A fragments `pa[4]` are packed.
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_columns_of(
    s: &mut String,
    (acc, src, k): (&str, &str, usize),
    count: usize,
    tile: &str,
    stride: usize,
    tag: &str,
    qt: usize,
    after_pack: &str,
) {
    let (acc, src) = (tiled(acc, qt), tiled(src, qt));
    let pa = tiled("pa", qt);
    let ind = "    ";
    let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int kk = 0; kk < {}; ++kk) {{", k / 16);
    if qt > 1 {
        let _ = writeln!(s, "{ind}  U pa[{qt}][4];");
        let pack = format!(
            "{pa}[0] = kiln::pack2({src}[2 * kk][0], {src}[2 * kk][1], {tag});\n\
             {pa}[1] = kiln::pack2({src}[2 * kk][2], {src}[2 * kk][3], {tag});\n\
             {pa}[2] = kiln::pack2({src}[2 * kk + 1][0], {src}[2 * kk + 1][1], {tag});\n\
             {pa}[3] = kiln::pack2({src}[2 * kk + 1][2], {src}[2 * kk + 1][3], {tag});\n"
        );
        each_tile(s, &format!("{ind}  "), qt, &pack);
    } else {
        let _ = writeln!(
            s,
            "{ind}  const U pa[4] = {{kiln::pack2({src}[2 * kk][0], {src}[2 * kk][1], {tag}), \
             kiln::pack2({src}[2 * kk][2], {src}[2 * kk][3], {tag}),\n{ind}    \
             kiln::pack2({src}[2 * kk + 1][0], {src}[2 * kk + 1][1], {tag}), \
             kiln::pack2({src}[2 * kk + 1][2], {src}[2 * kk + 1][3], {tag})}};"
        );
        indent(s, &format!("{ind}  "), after_pack);
    }
    if count >= 2 {
        let _ =
            writeln!(s, "{ind}  #pragma unroll\n{ind}  for (int n = 0; n < {}; n += 2) {{", count / 2 * 2);
        let _ = writeln!(s, "{ind}    U bf[4];");
        let _ = writeln!(
            s,
            "{ind}    kiln::ldsm_x4_trans(bf, &({tile})[(kk * 16 + (lane & 15)) * {stride} + (n + (lane >> 4)) * 8]);"
        );
        let products = format!(
            "kiln::mma_16816({acc}[n], {pa}, bf, {tag});\nkiln::mma_16816({acc}[n + 1], {pa}, bf + 2, {tag});\n"
        );
        each_tile(s, &format!("{ind}    "), qt, &products);
        let _ = writeln!(s, "{ind}  }}");
    }
    if count % 2 == 1 {
        let n = count - 1;
        let _ = writeln!(s, "{ind}  {{\n{ind}    U bf[2];");
        let _ = writeln!(
            s,
            "{ind}    kiln::ldsm_x2_trans(bf, &({tile})[(kk * 16 + (lane & 15)) * {stride} + {n} * 8]);"
        );
        each_tile(s, &format!("{ind}    "), qt, &format!("kiln::mma_16816({acc}[{n}], {pa}, bf, {tag});\n"));
        let _ = writeln!(s, "{ind}  }}");
    }
    let _ = writeln!(s, "{ind}}}");
}

/// [`mma_rows`] for `qt` query tiles a warp whose A fragments stay in
/// the shared array `a` (the warp's rows `16 qt w ..`, stride `astride`):
/// a k-step at a time, each tile's fragment is one `ldmatrix` and serves
/// every column group of B, so the queries cost half the bytes of the
/// keys. For heads too wide for two tiles of query fragments in registers
/// beside the scores and the output; with `qt` = 1, for the backward's
/// kernels that keep a warp's own 16 rows (keys and values, or queries and
/// output gradients) in shared memory (`attention_grad_split.rs`).
#[allow(clippy::too_many_arguments)]
pub(super) fn mma_rows_shared_a(
    s: &mut String,
    acc: &str,
    count: usize,
    ks: usize,
    (a, astride): (&str, usize),
    tile: &str,
    stride: usize,
    tag: &str,
    qt: usize,
) {
    debug_assert!(count % 2 == 0, "mma_rows_shared_a pairs its column groups");
    let ind = "    ";
    let (acc, qa) = (tiled(acc, qt), tiled("qa", qt));
    let zero = format!(
        "#pragma unroll\nfor (int n = 0; n < {count}; ++n) {acc}[n][0] = {acc}[n][1] = {acc}[n][2] = {acc}[n][3] = 0.f;\n"
    );
    each_tile(s, ind, qt, &zero);
    let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int kk = 0; kk < {ks}; ++kk) {{");
    let (dims, row) = if qt > 1 {
        (format!("[{qt}]"), format!("w * {} + tq * 16", 16 * qt))
    } else {
        (String::new(), "w * 16".into())
    };
    let _ = writeln!(s, "{ind}  U qa{dims}[4];");
    let load = format!(
        "kiln::ldsm_x4({qa}, &{a}[({row} + (lane & 15)) * {astride} + kk * 16 + (lane >> 4) * 8]);\n"
    );
    each_tile(s, &format!("{ind}  "), qt, &load);
    let _ = writeln!(s, "{ind}  #pragma unroll\n{ind}  for (int n = 0; n < {count}; n += 2) {{");
    row_pair_products(s, &format!("{ind}    "), (tile, stride), &acc, &qa, tag, qt);
    let _ = writeln!(s, "{ind}  }}\n{ind}}}");
}

/// `x`, indexed by the query tile `tq` where a warp has several.
fn tiled(x: &str, qt: usize) -> String {
    if qt > 1 {
        format!("{x}[tq]")
    } else {
        x.to_string()
    }
}

/// `code` at indent `ind`: as it is for one query tile, else in an
/// unrolled loop over the warp's `qt` tiles (`tq`).
pub(super) fn each_tile(s: &mut String, ind: &str, qt: usize, code: &str) {
    if qt > 1 {
        let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int tq = 0; tq < {qt}; ++tq) {{");
        indent(s, &format!("{ind}  "), code);
        let _ = writeln!(s, "{ind}}}");
    } else {
        indent(s, ind, code);
    }
}
