//! The panel pair product (sixteen rows times many tokens, the inner loop of
//! a prompt's matrix products) in each instruction set that has one, timed
//! alone on one thread.
//!
//!     cargo bench --bench panel_pair                 # Q4_1, 576 columns, 128 tokens
//!     cargo bench --bench panel_pair -- q4_k 2048 64 # type, columns, tokens

use m40llm::quant::pair_timing::PairBench;
use m40llm::quant::{GgmlType, Isa, Kernels};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let ty = args.first().map_or(GgmlType::Q4_1, |name| {
        GgmlType::SUPPORTED
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("{name}: not a supported type"))
    });
    let cols: usize = args.get(1).map_or(576, |v| v.parse().expect("columns"));
    let n_tokens: usize = args.get(2).map_or(128, |v| v.parse().expect("tokens"));
    let bench = PairBench::new(ty, cols, n_tokens);
    println!("{ty}, 16 rows x {cols} columns, {n_tokens} tokens, one thread");
    let calls = (2_000_000_000 / bench.multiply_adds()).max(10);
    for isa in Isa::all_available() {
        let kernels = Kernels::for_isa(isa).expect("available");
        let Some(best) = bench.seconds(kernels, calls, 5) else {
            continue;
        };
        println!(
            "{:>8}: {:7.2} us a pair product, {:6.1} G multiply-adds/s",
            isa.name(),
            best * 1e6,
            bench.multiply_adds() as f64 / best / 1e9
        );
    }
    println!("Kernels::best(): {}", Kernels::best().isa().name());
}
