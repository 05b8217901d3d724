//! Tokenizer throughput on about 1 MB of English prose, in MB/s.
//!
//!     cargo bench --bench tokenize                 # Gemma 3 (SentencePiece, 262k tokens)
//!     cargo bench --bench tokenize -- --file=x.txt # tokenize a file of your own instead
//!
//! The text is generated (seeded, so every run sees the same bytes): English
//! sentences with varying names, numbers and places, in paragraphs, some
//! wrapped at 72 columns, separated by blank lines. Gemma's vocabulary makes
//! newlines and runs of spaces special tokens, so the special-token partition
//! is part of what is measured. The Gemma file is found as the tests find it
//! (`$M40_GEMMA_GGUF`, else the model cache, fetched once); the GPT-2 and
//! LLaMA vocabularies too (`tests/data/vocab`, or fetched as the tests fetch them).

use std::path::{Path, PathBuf};
use std::time::Instant;

use m40llm::model::{LoadOptions, Model};

#[path = "../tests/common/mod.rs"]
mod common;

const TARGET_BYTES: usize = 1 << 20;
const RUNS: usize = 5;

const SENTENCES: &[&str] = &[
    "The morning train to {city} left the station {n} minutes late, and nobody on the platform seemed surprised.",
    "{name} had kept the old ledger in a drawer for years, though she could no longer remember why.",
    "By the autumn of {year}, the village had lost half of its bakeries and all of its patience.",
    "\"You can't be serious,\" said {name}, folding the letter twice before putting it back in the envelope.",
    "It rained for {n} days without stopping; the river rose, the roads flooded, and the school closed early.",
    "Most of the committee's recommendations were sensible, but the report itself ran to {n} pages.",
    "She walked along the harbour wall, counting the fishing boats that had not come back.",
    "In {year}, the museum in {city} bought a painting that nobody could attribute with any confidence.",
    "The recipe called for two cups of flour, a pinch of salt, and considerably more butter than seemed wise.",
    "He wasn't sure whether the noise came from the attic or from the garden, and he didn't want to find out.",
    "Prices at the market had risen by {n} percent since spring, which the farmers blamed on the weather.",
    "{name} read the first chapter three times before admitting that the translation was simply wrong.",
    "There is a particular kind of silence that settles over a library an hour before it closes.",
    "The engineers measured the bridge again and found that it had moved {n} millimetres since {year}.",
    "When the lights went out, the orchestra kept playing, and the audience, to its credit, kept listening.",
    "Nobody in {city} remembered who had planted the chestnut trees along the main avenue.",
    "I'd like to think we learned something from all this, though I'm not entirely convinced we did.",
    "The ferry crossed the strait twice a day in summer and once a week in winter, weather permitting.",
    "{name}'s grandfather had built the house by hand, and it showed in every crooked window frame.",
    "According to the survey, {n} of the households questioned owned at least one bicycle they never used.",
    "They argued about the map for an hour; in the end they took the longer road, and arrived before dark.",
    "The professor's lecture on medieval trade routes was, by general agreement, the best of the term.",
    "A letter postmarked {city}, {year}, turned up in the lost property office with no name on it.",
    "Snow fell softly on the rooftops while the town slept, unaware of the storm gathering to the north.",
    "What began as a small garden project became, over {n} years, the largest orchard in the county.",
    "The new library opened on a Tuesday; by Friday, every chair in the reading room had been claimed.",
    "{name} packed a notebook, two pencils, a thermos of coffee, and very little else.",
    "Critics described the play as \"ambitious, uneven and occasionally brilliant\", which was fair.",
    "The lighthouse keeper wrote down the passing ships each night, a habit he kept long after retiring.",
    "In the spring of {year}, a group of students in {city} started a newspaper that still exists today.",
];
const NAMES: &[&str] = &[
    "Margaret", "Tomás", "Eleanor", "Ravi", "Hannah", "Oliver", "Ingrid", "Samuel", "Chloé",
    "Daniel",
];
const CITIES: &[&str] = &[
    "Lisbon",
    "Edinburgh",
    "Kraków",
    "Montreal",
    "Bristol",
    "Trieste",
    "Dublin",
    "Valparaíso",
];

/// A small xorshift generator: the same text on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn sentence(rng: &mut Rng) -> String {
    let mut s = SENTENCES[rng.below(SENTENCES.len())].to_string();
    while let Some(i) = s.find('{') {
        let j = s[i..].find('}').unwrap() + i;
        let value = match &s[i + 1..j] {
            "name" => NAMES[rng.below(NAMES.len())].to_string(),
            "city" => CITIES[rng.below(CITIES.len())].to_string(),
            "year" => (1850 + rng.below(170)).to_string(),
            _ => (2 + rng.below(400)).to_string(),
        };
        s.replace_range(i..=j, &value);
    }
    s
}

/// About `target` bytes of English prose.
fn corpus(target: usize) -> String {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut text = String::with_capacity(target + 1024);
    while text.len() < target {
        let paragraph: Vec<String> = (0..3 + rng.below(6)).map(|_| sentence(&mut rng)).collect();
        let paragraph = paragraph.join(" ");
        if rng.below(2) == 0 {
            // Hard-wrapped at 72 columns, as plain-text files often are.
            let mut line = 0;
            for word in paragraph.split(' ') {
                if line > 0 && line + 1 + word.len() > 72 {
                    text.push('\n');
                    line = 0;
                } else if line > 0 {
                    text.push(' ');
                    line += 1;
                }
                text.push_str(word);
                line += word.len();
            }
        } else {
            text.push_str(&paragraph);
        }
        text.push_str("\n\n");
    }
    text
}

fn measure(label: &str, path: &Path, text: &str) {
    let t0 = Instant::now();
    let options = LoadOptions {
        vocab_only: true,
        ..LoadOptions::default()
    };
    let model = match Model::load(path, options) {
        Ok(model) => model,
        Err(e) => {
            println!("{label}: skipped ({e})");
            return;
        }
    };
    let load = t0.elapsed().as_secs_f64();
    let tokenizer = model.tokenizer();
    let mut times = Vec::with_capacity(RUNS);
    let mut n_tokens = 0;
    for _ in 0..=RUNS {
        let t = Instant::now();
        let tokens = tokenizer.tokenize(text, false, false).expect("tokenize");
        times.push(t.elapsed().as_secs_f64());
        n_tokens = tokens.len();
    }
    times.remove(0); // warm-up
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mb = text.len() as f64 / 1e6;
    println!(
        "{label}: {:.2} MB -> {n_tokens} tokens in {median:.3} s (median of {RUNS}; best {:.3} s): {:.2} MB/s, {:.0} tokens/s; vocabulary loaded in {load:.2} s",
        mb,
        times[0],
        mb / median,
        n_tokens as f64 / median,
    );
}

fn main() {
    let file = std::env::args().find_map(|a| a.strip_prefix("--file=").map(PathBuf::from));
    let text = match &file {
        Some(path) => std::fs::read_to_string(path).expect("a UTF-8 text file"),
        None => corpus(TARGET_BYTES),
    };
    println!("text: {} bytes, {} lines", text.len(), text.lines().count());
    measure("gemma3 (SPM, 262144 tokens)", &common::gemma_path(), &text);
    measure(
        "llama-spm (SPM, 32000 tokens)",
        &common::vocab_path("llama-spm"),
        &text,
    );
    measure(
        "gpt-2 (BPE, 50257 tokens)",
        &common::vocab_path("gpt-2"),
        &text,
    );
}
