//! Panel pair products on AMX tiles (Intel Xeon from Sapphire Rapids on).
//!
//! A `tdpbsud` multiplies sixteen tokens' activations (signed bytes, a
//! token a tile row, read where they lie in their `Q8Block`s) with the
//! unsigned codes of two panels side by side (a 64-byte row holds four
//! columns of all sixteen rows, chunk k of each panel): one instruction
//! gives a 32-column sub-block's integer sums for sixteen tokens and
//! sixteen rows, which the VNNI pair product ([`super::gemm`]) makes with
//! 128 `vpdpbusd`.
//!
//! The sums leave the tiles through memory and are scaled in 512-bit
//! vectors exactly as [`super::gemm`]'s pair product scales its own, in the
//! same order of f32 operations, so a row's result is the same bit for bit
//! on either path (`tests/quant.rs`). That scaling, four vector operations a
//! token and sub-block, is what limits the product: the tile work of the
//! next [`AHEAD`] sub-blocks is issued before a sub-block is scaled, so the
//! tile unit runs beside the vector units rather than before them. On the
//! 2-core development VM (one 512-bit FMA port) a pair of 576-column panels
//! times 128 tokens takes 5.1–5.4 µs against VNNI's 5.5–6.4 µs. On an H200
//! machine's Xeon host they did not run side by side: in this loop's
//! skeleton (`tools/amx_pair_skeleton.c`) the tile work alone took 2.4 µs,
//! the scaling alone 2.2 and both 4.6–4.7, with two to four sub-blocks
//! ahead, and VNNI won the startup timing there (docs/cpu.md, which has a
//! second machine's figures too).
//!
//! The tile instructions are written as inline assembly: Rust's AMX
//! intrinsics are not stable.

use std::arch::asm;
use std::arch::x86_64::*;

use super::gemm::{pair_factors, panel_product_shapes, scale_pair_sums};
use crate::quant::panel::{Panel, PanelOut, PANEL_ROWS};
use crate::quant::Q8Block;

/// Tokens a tile of activations holds: its sixteen rows.
const TILE_TOKENS: usize = 16;

/// Sub-blocks whose sums are computed and stored ahead of the one being
/// scaled.
const AHEAD: usize = 2;

/// Whether this CPU and OS run AMX-INT8 tiles for this process: CPUID's
/// AMX-TILE and AMX-INT8, the OS saving tile state (XCR0 bits 17 and 18),
/// and Linux granting the process the tile data (`ARCH_REQ_XCOMP_PERM`),
/// asked once.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| super::avx512_available() && cpu_has_amx() && os_grants_tiles())
}

fn cpu_has_amx() -> bool {
    if __cpuid(0).eax < 7 {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
    // XGETBV needs OSXSAVE (leaf 1, ECX bit 27).
    let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
    if !(tile && int8 && osxsave) {
        return false;
    }
    // SAFETY: OSXSAVE is set, so XGETBV is enabled.
    let xcr0 = unsafe { _xgetbv(0) };
    xcr0 & (3 << 17) == 3 << 17
}

#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes what the kernel
    // lets this process's threads save; it reads and writes no memory.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// LDTILECFG's 64-byte operand, palette 1.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes a row of each tile register.
    colsb: [u16; 16],
    /// Rows of each tile register.
    rows: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<TileConfig>() == 64);
// The activations' tile rows start at a block's codes.
const _: () = assert!(std::mem::offset_of!(Q8Block, qs) == 12);

impl TileConfig {
    /// The registers of [`pair_tiles`] for `tokens` tokens (1..=16) and
    /// sub-blocks of `sub` columns, two sets of three so that a sub-block's
    /// tiles are loaded while the previous one's are in use: tmm0 and tmm1
    /// the activations (a token a row, `sub` bytes), tmm2 and tmm3 the two
    /// panels' codes side by side (`sub / 4` rows of 64 bytes: a chunk of
    /// panel a, then panel b's), tmm4 and tmm5 the sums (a token a row,
    /// sixteen i32).
    fn pair(sub: usize, tokens: usize) -> TileConfig {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut set = |tile: usize, rows: usize, bytes: usize| {
            config.rows[tile] = rows as u8;
            config.colsb[tile] = bytes as u16;
        };
        for (acts, codes, sums) in [(0, 2, 4), (1, 3, 5)] {
            set(acts, tokens, sub);
            set(codes, sub / 4, 64);
            set(sums, tokens, 64);
        }
        config
    }
}

/// A sub-block's sums of sixteen rows for up to sixteen tokens: row t of
/// the buffer is token t's sums, panel a's eight rows then panel b's.
#[repr(C, align(64))]
struct Sums([[i32; 2 * PANEL_ROWS]; TILE_TOKENS]);

/// Computes one sub-block's integer sums into tile `$sums`: tokens from
/// `act` (the first token's bytes; the next `stride` bytes on), codes from
/// `codes` (the sub-block's first row of pair codes), through tiles
/// `$acts` and `$codes`.
macro_rules! sub_block_sums {
    ($acts:literal, $codes:literal, $sums:literal, $act:expr, $stride:expr, $pair:expr) => {
        asm!(
            concat!("tileloadd ", $acts, ", [{act} + {stride} * 1]"),
            concat!("tileloadd ", $codes, ", [{codes} + {row} * 1]"),
            concat!("tilezero ", $sums),
            concat!("tdpbsud ", $sums, ", ", $acts, ", ", $codes),
            act = in(reg) $act,
            stride = in(reg) $stride,
            codes = in(reg) $pair,
            row = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// Stores tile `$sums` to `out`, a token's sixteen sums a 64-byte row.
macro_rules! store_sums {
    ($sums:literal, $out:expr) => {
        asm!(
            concat!("tilestored [{out} + {row} * 1], ", $sums),
            out = in(reg) $out,
            row = in(reg) 64usize,
            options(nostack),
        )
    };
}

thread_local! {
    /// Each thread's two panels' codes side by side ([`pair_codes`]).
    static PAIR_CODES: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Panels `a` and `b`'s codes as one tile operand: 64-byte rows, chunk k
/// of `a` then chunk k of `b`, so that a row holds four columns of all
/// sixteen rows.
fn pair_codes(a: &Panel, b: &Panel, out: &mut Vec<u8>) {
    out.clear();
    for (ca, cb) in a.codes.chunks_exact(32).zip(b.codes.chunks_exact(32)) {
        out.extend_from_slice(ca);
        out.extend_from_slice(cb);
    }
}

/// Panels `a` and `b` dotted with `T` consecutive tokens starting at
/// `acts` (`blocks` blocks a token): value r of `out`'s run t0 + t,
/// [`super::gemm`]'s pair product bit for bit.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI and [`available`] said yes; the tiles
/// are configured by [`TileConfig::pair`] for `T` tokens and `SUB`; `acts`
/// holds `T · blocks` blocks; `out` has runs of 16 values, at least
/// t0 + T; both panels have `blocks · 32` columns in sub-blocks of `SUB`.
#[inline(always)]
unsafe fn pair_tiles<const SUB: usize, const T: usize>(
    a: &Panel,
    b: &Panel,
    pair: &[u8],
    acts: &[Q8Block],
    blocks: usize,
    out: &mut PanelOut,
    t0: usize,
) {
    let stride = blocks * std::mem::size_of::<Q8Block>();
    let mut sums: [Sums; AHEAD + 1] =
        std::array::from_fn(|_| Sums([[0; 2 * PANEL_ROWS]; TILE_TOKENS]));
    let subs = a.cols / SUB;
    // Sub-block g's sums, through tile set g % 2, stored to buffer
    // g % (AHEAD + 1) while sub-block g − AHEAD is scaled.
    let compute = |g: usize| {
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        // SAFETY (pointer arithmetic): block < blocks and first + SUB <= 32
        // keep every tile row inside its token's block; pair-code rows
        // g·SUB/4 and its SUB/4 − 1 successors are inside `pair`.
        let act = acts.as_ptr().add(block).cast::<u8>().add(12 + first);
        let codes = pair.as_ptr().add(g * SUB * 16);
        if g.is_multiple_of(2) {
            sub_block_sums!("tmm0", "tmm2", "tmm4", act, stride, codes);
        } else {
            sub_block_sums!("tmm1", "tmm3", "tmm5", act, stride, codes);
        }
    };
    let store = |g: usize, sums: &mut [Sums; AHEAD + 1]| {
        let out = sums[g % (AHEAD + 1)].0.as_mut_ptr().cast::<u8>();
        if g.is_multiple_of(2) {
            store_sums!("tmm4", out);
        } else {
            store_sums!("tmm5", out);
        }
    };
    let mut acc = [_mm512_setzero_ps(); T];
    for g in 0..AHEAD.min(subs) {
        compute(g);
        store(g, &mut sums);
    }
    for g in 0..subs {
        if g + AHEAD < subs {
            compute(g + AHEAD);
            store(g + AHEAD, &mut sums);
        }
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        let factors = pair_factors(a, b, g);
        let isums = &sums[g % (AHEAD + 1)].0;
        for t in 0..T {
            let act = &*acts.as_ptr().add(t * blocks + block);
            let isum = _mm512_load_si512(isums[t].as_ptr().cast());
            acc[t] = scale_pair_sums::<SUB>(isum, act, first, factors, acc[t]);
        }
    }
    for (t, s) in acc.into_iter().enumerate() {
        _mm512_storeu_ps(out.run(t0 + t)[..2 * PANEL_ROWS].as_mut_ptr(), s);
    }
}

/// Value r of `out`'s run t = row r of panels `a` then `b` · token t for
/// every token of `acts`, sixteen tokens a tile:
/// [`super::gemm::product_pair`]'s result, bit for bit.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI, and [`available`] said yes.
#[inline(always)]
pub(super) unsafe fn product_pair<const SUB: usize>(
    a: &Panel,
    b: &Panel,
    acts: &[Q8Block],
    mut out: PanelOut,
) {
    let (blocks, n_tokens) = panel_product_shapes(&[a, b], SUB, acts, &out, 2 * PANEL_ROWS);
    let mut pair = PAIR_CODES.take();
    pair_codes(a, b, &mut pair);
    let mut configured = 0;
    let mut t0 = 0;
    while t0 < n_tokens {
        let n = (n_tokens - t0).min(TILE_TOKENS);
        if n != configured {
            let config = TileConfig::pair(SUB, n);
            // SAFETY: a palette-1 configuration within the tiles' limits
            // (at most 16 rows of at most 64 bytes).
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
            configured = n;
        }
        let acts = &acts[t0 * blocks..(t0 + n) * blocks];
        macro_rules! tiles {
            ($($n:literal),*) => {
                match n {
                    // SAFETY: the tiles are configured for n tokens; `acts`
                    // holds n tokens' blocks, `out` runs t0..t0 + n.
                    $($n => pair_tiles::<SUB, $n>(a, b, &pair, acts, blocks, &mut out, t0),)*
                    _ => unreachable!("{n} tokens a tile"),
                }
            };
        }
        tiles!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
        t0 += n;
    }
    // Leaves the tile state as a thread without tiles has it, so that the
    // OS saves none of it when the thread is switched out.
    asm!("tilerelease", options(nostack, nomem));
    PAIR_CODES.set(pair);
}
