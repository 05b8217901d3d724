//! llama.cpp's reference outputs for Gemma 3 270M Q4_K_M
//! (`tests/data/reference/gemma3-270m-q4_k_m.greedy.jsonl`): per prompt,
//! its token ids and llama.cpp's top logits at each greedy step.

pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    /// Per step: the reference's top tokens with their logits, best first.
    pub steps: Vec<Vec<(u32, f32)>>,
}

pub fn cases() -> Vec<Case> {
    let reference = super::test_data("reference/gemma3-270m-q4_k_m.greedy.jsonl");
    std::fs::read_to_string(reference)
        .unwrap()
        .lines()
        .map(parse_case)
        .collect()
}

/// The cases of one random-weight model of the 2026 architectures
/// (`reference/arch2-tiny-llamacpp.jsonl`, its `"model"` key, e.g. "qwen3-f16").
pub fn arch2_cases(model: &str) -> Vec<Case> {
    let reference = super::test_data("reference/arch2-tiny-llamacpp.jsonl");
    let key = format!("\"model\": \"{model}\"");
    let cases: Vec<Case> = std::fs::read_to_string(reference)
        .unwrap()
        .lines()
        .filter(|line| line.contains(&key))
        .map(parse_case)
        .collect();
    assert!(!cases.is_empty(), "no reference for model {model}");
    cases
}

/// A fresh session of `model` as the references are compared in: 2,048
/// positions, prompts in chunks of up to 512 tokens.
pub fn session(model: &std::sync::Arc<m40llm::model::Model>) -> m40llm::session::Session {
    let params = m40llm::session::SessionParams {
        n_ctx: 2048,
        n_batch: 512,
    };
    m40llm::session::Session::new(std::sync::Arc::clone(model), params).unwrap()
}

/// How far a model's logits are from llama.cpp's, fed llama.cpp's tokens.
pub struct TeacherForced {
    /// Per step, |ours − llama.cpp's| / max(1, |llama.cpp's|) of llama.cpp's
    /// top-1 logit, sorted.
    pub errors: Vec<f64>,
    /// Steps where llama.cpp's top-2 margin exceeds 0.5 and our top-1 differs.
    pub disagreements: Vec<String>,
    /// The largest errors with their (prompt, step), largest first.
    pub worst: Vec<(f64, usize, usize)>,
}

impl TeacherForced {
    /// Decodes each case's prompt, then at each step compares the logits
    /// with the reference's and feeds the reference's top-1 token.
    pub fn run(model: &std::sync::Arc<m40llm::model::Model>, cases: &[Case]) -> TeacherForced {
        let mut errors = Vec::new();
        let mut located = Vec::new();
        let mut disagreements = Vec::new();
        for (ci, case) in cases.iter().enumerate() {
            let mut session = session(model);
            session.decode(&case.prompt_ids).unwrap();
            for (si, top) in case.steps.iter().enumerate() {
                let logits = session.logits().unwrap();
                let (ref_tok, ref_logit) = top[0];
                let ours = logits[ref_tok as usize];
                let error = ((ours - ref_logit).abs() / ref_logit.abs().max(1.0)) as f64;
                errors.push(error);
                located.push((error, ci, si));
                let our_top = m40llm::sampling::argmax(logits);
                let margin = top[0].1 - top[1].1;
                if margin > 0.5 && our_top != ref_tok {
                    disagreements.push(format!(
                        "prompt {ci} step {si}: ours {our_top}, llama.cpp {ref_tok} (margin {margin})"
                    ));
                }
                session.decode(&[ref_tok]).unwrap();
            }
        }
        errors.sort_by(f64::total_cmp);
        located.sort_by(|a, b| b.0.total_cmp(&a.0));
        located.truncate(3);
        TeacherForced {
            errors,
            disagreements,
            worst: located,
        }
    }

    /// The error at quantile `q` (0.5: the median).
    pub fn percentile(&self, q: f64) -> f64 {
        self.errors[((self.errors.len() - 1) as f64 * q).round() as usize]
    }

    pub fn summary(&self) -> String {
        let worst: Vec<String> = self
            .worst
            .iter()
            .map(|(e, prompt, step)| format!("{:.2}% (prompt {prompt} step {step})", e * 100.0))
            .collect();
        format!(
            "{} steps: relative error of the reference top-1 logit median {:.2}%, p95 {:.2}%, max {:.2}%; largest {}",
            self.errors.len(),
            self.percentile(0.5) * 100.0,
            self.percentile(0.95) * 100.0,
            self.percentile(1.0) * 100.0,
            worst.join(", ")
        )
    }
}

/// The case of `prompt`.
pub fn case(prompt: &str) -> Case {
    cases()
        .into_iter()
        .find(|c| c.prompt == prompt)
        .unwrap_or_else(|| panic!("no reference for {prompt:?}"))
}

/// Pulls the fields out of one JSONL line (a fixed, known shape).
fn parse_case(line: &str) -> Case {
    let prompt_at = line.find("\"prompt\": \"").unwrap() + "\"prompt\": \"".len();
    let prompt = json_string_body(&line[prompt_at..]);
    let ids_at = line.find("\"prompt_ids\"").unwrap();
    let open = ids_at + line[ids_at..].find('[').unwrap();
    let close = open + line[open..].find(']').unwrap();
    let prompt_ids = line[open + 1..close]
        .split(',')
        .map(|v| v.trim().parse().unwrap())
        .collect();
    let steps = line[close..]
        .split("\"top\"")
        .skip(1)
        .map(|step| {
            let end = step.find("]]").unwrap();
            step[..end]
                .split('[')
                .filter_map(|pair| {
                    let pair = pair.trim_matches(|c| c == ']' || c == ',' || c == ' ' || c == ':');
                    let (t, l) = pair.split_once(',')?;
                    Some((t.trim().parse().ok()?, l.trim().parse().ok()?))
                })
                .collect()
        })
        .collect();
    Case {
        prompt,
        prompt_ids,
        steps,
    }
}

/// The JSON string whose body starts `s`, unescaped, up to its closing quote.
fn json_string_body(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return out,
            '\\' => match chars.next().unwrap() {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    panic!("unterminated JSON string")
}

/// The reference's greedy continuation of `case`: its top-1 tokens, up to
/// the first step where llama.cpp's own top-2 margin is under 0.5 (past such
/// a near-tie either choice is right, and the sequences may part).
pub fn confident_greedy_prefix(case: &Case) -> Vec<u32> {
    case.steps
        .iter()
        .take_while(|top| top[0].1 - top[1].1 > 0.5)
        .map(|top| top[0].0)
        .collect()
}
