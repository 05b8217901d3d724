//! Panel pair products on AMX tiles (Intel Xeon from Sapphire Rapids on).
//!
//! A `tdpbsud` multiplies sixteen tokens' activations (signed bytes, a
//! token a tile row, read where they lie in their `Q8Block`s) with the
//! unsigned codes of a pair of panels ([`Panel::pair`]: a 64-byte chunk
//! holds four columns of all sixteen rows, a tile row): one instruction
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
//! tile unit runs beside the vector units rather than before them. The
//! tiles read the pair's codes where the packers put them (a pair's 64-byte
//! chunks are tile rows) and stay configured from one call to the next.
//! On an H200 machine's Xeon host a pair of 576-column Q4_1 panels times
//! 128 tokens takes 4.7–4.8 µs against VNNI's 5.7, on another such host
//! 9.2 against 8.6. Whole prompts there ran faster on VNNI all the same,
//! so the tiles run only where `M40_CPU_ISA=amx` asks for them
//! ([`crate::quant::Kernels::best`], docs/cpu.md "AMX tiles").
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

/// LDTILECFG's and STTILECFG's 64-byte operand.
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq)]
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
    /// the activations (a token a row, `sub` bytes), tmm2 and tmm3 the
    /// pair's codes (`sub / 4` of its 64-byte chunks, a chunk a row), tmm4
    /// and tmm5 the sums (a token a row, sixteen i32).
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
/// the buffer is token t's sums, the pair's half 0's eight rows then half
/// 1's.
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

/// The tiles' configuration as the CPU holds it: all zeros when they are
/// not configured.
///
/// # Safety
/// [`available`] said yes.
unsafe fn current_config() -> TileConfig {
    let mut current = std::mem::MaybeUninit::<TileConfig>::uninit();
    // SAFETY: STTILECFG writes all 64 bytes of its aligned operand (zeros
    // when the tiles are not configured), and every bit pattern is a
    // TileConfig.
    asm!("sttilecfg [{}]", in(reg) current.as_mut_ptr(), options(nostack));
    current.assume_init()
}

/// Loads `config` unless the tiles hold it already (`current`).
///
/// # Safety
/// [`available`] said yes; `config` is a palette-1 configuration within
/// the tiles' limits (at most 16 rows of at most 64 bytes).
unsafe fn configure(config: &TileConfig, current: &mut TileConfig) {
    if current != config {
        asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly));
        *current = *config;
    }
}

/// A pair of panels dotted with `T` consecutive tokens starting at `acts`
/// (`blocks` blocks a token): value r of `out`'s run t0 + t,
/// [`super::gemm`]'s pair product bit for bit.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI and [`available`] said yes; the tiles
/// are configured by [`TileConfig::pair`] for `T` tokens and `SUB`; `acts`
/// holds `T · blocks` blocks; `out` has runs of 16 values, at least
/// t0 + T; `pair` is a pair of `blocks · 32` columns in sub-blocks of `SUB`.
#[inline(always)]
unsafe fn pair_tiles<const SUB: usize, const T: usize>(
    pair: &Panel,
    acts: &[Q8Block],
    blocks: usize,
    out: &mut PanelOut,
    t0: usize,
) {
    let stride = blocks * std::mem::size_of::<Q8Block>();
    // Rows 0..T of a buffer are stored (the tiles have T rows) before they
    // are read; the rest are never read. Zeroing them would be 3 KB of
    // stores every sixteen tokens.
    let mut sums = std::mem::MaybeUninit::<[Sums; AHEAD + 1]>::uninit();
    let sums = sums.as_mut_ptr().cast::<Sums>();
    let subs = pair.cols / SUB;
    // Sub-block g's sums, through tile set g % 2, stored to buffer
    // g % (AHEAD + 1) after sub-block g − AHEAD is scaled.
    let compute = |g: usize| {
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        // SAFETY (pointer arithmetic): block < blocks and first + SUB <= 32
        // keep every tile row inside its token's block; chunks g·SUB/4 and
        // its SUB/4 − 1 successors (64 bytes each) are inside the codes.
        let act = acts.as_ptr().add(block).cast::<u8>().add(12 + first);
        let codes = pair.codes.as_ptr().add(g * SUB * 16);
        if g.is_multiple_of(2) {
            sub_block_sums!("tmm0", "tmm2", "tmm4", act, stride, codes);
        } else {
            sub_block_sums!("tmm1", "tmm3", "tmm5", act, stride, codes);
        }
    };
    let store = |g: usize| {
        let out = sums.add(g % (AHEAD + 1)).cast::<u8>();
        if g.is_multiple_of(2) {
            store_sums!("tmm4", out);
        } else {
            store_sums!("tmm5", out);
        }
    };
    let mut acc = [_mm512_setzero_ps(); T];
    for g in 0..AHEAD.min(subs) {
        compute(g);
        store(g);
    }
    for g in 0..subs {
        // Sub-block g + AHEAD's tile work is issued before g is scaled and
        // stored after it: on an H200 machine's host the Q4_1 pair product
        // took 4.7–4.8 µs against 5.2–5.3 with the store first.
        if g + AHEAD < subs {
            compute(g + AHEAD);
        }
        let (block, first) = (g * SUB / 32, g * SUB % 32);
        let factors = pair_factors(pair, g);
        // Raw pointers only: rows T.. of the buffer are never written.
        let isums = sums.add(g % (AHEAD + 1)).cast::<[i32; 2 * PANEL_ROWS]>();
        for (t, acc) in acc.iter_mut().enumerate() {
            let act = &*acts.as_ptr().add(t * blocks + block);
            let isum = _mm512_load_si512(isums.add(t).cast());
            *acc = scale_pair_sums::<SUB>(isum, act, first, factors, *acc);
        }
        if g + AHEAD < subs {
            store(g + AHEAD);
        }
    }
    for (t, s) in acc.into_iter().enumerate() {
        _mm512_storeu_ps(out.run(t0 + t)[..2 * PANEL_ROWS].as_mut_ptr(), s);
    }
}

/// Value r of `out`'s run t = row r of a pair of panels · token t for
/// every token of `acts`, sixteen tokens a tile:
/// [`super::gemm::product_pair`]'s result, bit for bit.
///
/// What the tiles hold is read from the CPU at each call, not remembered
/// from the last one: other code of the host process may have run on the
/// thread in between and loaded a configuration of its own or released the
/// tiles, and a tile instruction under another configuration faults or
/// reads and writes past its operands. A configuration found there is put
/// back before the call returns (without the tiles' data, which loading a
/// configuration clears), for code that loads its own once per thread (as
/// ggml's AMX kernels do). Unconfigured tiles are left holding
/// this product's, for the thread's next call: releasing them
/// (`tilerelease`) so that the OS saves none of their state when the
/// thread is switched out, and configuring them again at the next call,
/// cost 2–5% of a SmolLM2-sized pair product on an H200 machine's Xeon
/// host (docs/cpu.md).
///
/// # Safety
/// The CPU has AVX-512 F and VNNI, and [`available`] said yes.
#[inline(always)]
pub(super) unsafe fn product_pair<const SUB: usize>(
    pair: &Panel,
    acts: &[Q8Block],
    mut out: PanelOut,
) {
    assert_eq!(pair.rows(), 2 * PANEL_ROWS, "a panel in a pair product");
    let (blocks, n_tokens) = panel_product_shapes(pair, SUB, acts, &out);
    let found = current_config();
    let mut current = found;
    let mut t0 = 0;
    while t0 < n_tokens {
        let n = (n_tokens - t0).min(TILE_TOKENS);
        // SAFETY: a palette-1 configuration within the tiles' limits.
        configure(&TileConfig::pair(SUB, n), &mut current);
        let acts = &acts[t0 * blocks..(t0 + n) * blocks];
        macro_rules! tiles {
            ($($n:literal),*) => {
                match n {
                    // SAFETY: the tiles are configured for n tokens; `acts`
                    // holds n tokens' blocks, `out` runs t0..t0 + n.
                    $($n => pair_tiles::<SUB, $n>(pair, acts, blocks, &mut out, t0),)*
                    _ => unreachable!("{n} tokens a tile"),
                }
            };
        }
        tiles!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
        t0 += n;
    }
    if found.palette != 0 && current != found {
        // SAFETY: a configuration the CPU held, read back by STTILECFG.
        asm!("ldtilecfg [{}]", in(reg) &found, options(nostack, readonly));
    }
}
