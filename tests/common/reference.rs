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
