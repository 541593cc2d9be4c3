//! A small mutation fuzzer for the parsers of user input (policies, quantities, durations, cron
//! schedules, catalogs, cluster files, scenarios, traces, CEL selectors): valid inputs are cut,
//! duplicated, re-indented and sprinkled with tokens that parsers trip on, and each result is
//! handed to a parser that must return (never panic) and, when it refuses, say where.
//!
//! Deterministic: case `i` of a run is the same on every machine. Cases per parser come from
//! `GNA_FUZZ_CASES` (default [`DEFAULT_CASES`], what the suite runs), the first case from
//! `GNA_FUZZ_START` (default 0), so a longer run covers new inputs:
//! `GNA_FUZZ_CASES=200000 GNA_FUZZ_START=1000 cargo test --all-features fuzz` (docs/testing.md).

use std::panic::{catch_unwind, AssertUnwindSafe};

use gpu_node_autoscaler_provider::rng::Rng;

/// Cases per parser in a plain test run.
pub const DEFAULT_CASES: u64 = 300;

/// Tokens that parsers of YAML, CSV, quantities and durations have trouble with.
const TOKENS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "-",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\"",
    "'",
    "#",
    "&a ",
    "*a",
    "!!str ",
    "!!binary ",
    "---\n",
    "...\n",
    "\t",
    "\n",
    "\r\n",
    " ",
    "  ",
    "|\n",
    ">-\n",
    "? ",
    "%YAML 1.2\n",
    "<<: *a\n",
    "0",
    "-1",
    "1e400",
    "-1e400",
    "1e-400",
    "9223372036854775807",
    "18446744073709551616",
    "99999999999999999999999999",
    "0.0000000001",
    "NaN",
    ".nan",
    ".inf",
    "-.inf",
    "0x",
    "0o7",
    "1_000",
    "080",
    "~",
    "null",
    "true",
    "yes",
    "on",
    "Ki",
    "Mi",
    "Gi",
    "Ei",
    "E",
    "m",
    "n",
    "u",
    "ms",
    "h",
    "d",
    "w",
    "s",
    "1h",
    "-5m",
    "Never",
    "*/0",
    "60",
    "24",
    "32",
    "*",
    "nvidia.com/gpu",
    "amd.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "aliyun.com/gpu-mem",
    "reserved",
    "spot",
    "on-demand",
    "p5.48xlarge",
    "us-east-1a",
    "ü",
    "\u{0}",
    "\u{feff}",
    "\u{1F600}",
    "\\",
    "\\u",
    "%",
    "@daily",
    "==",
    "&&",
    "||",
    "device.attributes[",
    "'gpu.nvidia.com'",
    "()",
    "(",
    ")",
    ".",
    "!",
    "in",
    "size(",
    "<=",
    "\"\"",
    "''",
    ",,",
    ",\n",
];

/// One input to try: its index in the run and the mutated text.
pub struct Case {
    pub index: u64,
    pub text: String,
}

/// The cases of a run: `GNA_FUZZ_CASES` mutations of the seeds, from `GNA_FUZZ_START`.
pub fn cases<'a>(seeds: &'a [&'a str]) -> impl Iterator<Item = Case> + 'a {
    let n = env_u64("GNA_FUZZ_CASES").unwrap_or(DEFAULT_CASES);
    let start = env_u64("GNA_FUZZ_START").unwrap_or(0);
    (start..start + n).map(move |index| {
        let mut rng = Rng::new(index ^ 0x5EED_F022);
        let seed = seeds[rng.below(seeds.len() as u64) as usize];
        Case {
            index,
            text: mutate(seed, &mut rng),
        }
    })
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: not a whole number")),
    )
}

/// `seed` with 1 to 6 edits.
pub fn mutate(seed: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = seed.split_inclusive('\n').map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    for _ in 0..1 + rng.below(6) {
        let n = lines.len() as u64;
        let i = rng.below(n) as usize;
        match rng.below(9) {
            0 if lines.len() > 1 => {
                lines.remove(i);
            }
            1 => {
                let j = rng.below(n) as usize;
                let copy = lines[j].clone();
                lines.insert(i, copy);
            }
            2 => {
                let j = rng.below(n) as usize;
                lines.swap(i, j);
            }
            3 => {
                // Re-indent: YAML's structure lives in its indentation.
                let body = lines[i].trim_start().to_string();
                let indent = rng.below(9) as usize;
                lines[i] = format!("{}{body}", " ".repeat(indent));
            }
            4 => {
                // Cut a line short, at a character boundary.
                let cut = char_boundary(&lines[i], rng);
                lines[i].truncate(cut);
            }
            5 => {
                // Replace a value (what follows the first `: ` or `,`) with a token.
                let token = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                let line = &lines[i];
                if let Some(p) = line
                    .find(": ")
                    .map(|p| p + 2)
                    .or_else(|| line.find(',').map(|p| p + 1))
                {
                    let end = line[p..].find([',', '\n']).map_or(line.len(), |e| p + e);
                    lines[i] = format!("{}{token}{}", &line[..p], &line[end..]);
                }
            }
            6 => {
                // Arbitrary characters.
                let len = 1 + rng.below(8);
                let junk: String = (0..len)
                    .map(|_| char::from_u32(rng.below(0x3000) as u32).unwrap_or('?'))
                    .collect();
                let at = char_boundary(&lines[i], rng);
                lines[i].insert_str(at, &junk);
            }
            7 => {
                // A digit run made huge, or negative.
                let line = &lines[i];
                if let Some(p) = line.find(|c: char| c.is_ascii_digit()) {
                    let repl = if rng.below(2) == 0 {
                        "99999999999999999999"
                    } else {
                        "-"
                    };
                    lines[i] = format!("{}{repl}{}", &line[..p], &line[p..]);
                }
            }
            _ => {
                let token = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                let at = char_boundary(&lines[i], rng);
                lines[i].insert_str(at, token);
            }
        }
    }
    lines.concat()
}

fn char_boundary(s: &str, rng: &mut Rng) -> usize {
    let bounds: Vec<usize> = s
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(s.len()))
        .collect();
    bounds[rng.below(bounds.len() as u64) as usize]
}

/// Runs `parse` on every case; a panic, or an error `check` refuses, fails with the case's
/// index and text. Returns how many cases parsed and how many were refused.
pub fn run<E>(
    what: &str,
    seeds: &[&str],
    parse: impl Fn(&str) -> Result<(), E>,
    check: impl Fn(&str, &E) -> Result<(), String>,
) -> (u64, u64) {
    let (mut ok, mut refused) = (0, 0);
    for case in cases(seeds) {
        let outcome = catch_unwind(AssertUnwindSafe(|| parse(&case.text)));
        match outcome {
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "{what}: case {} panicked: {msg}\n--- input ---\n{}\n--- end ---",
                    case.index, case.text
                );
            }
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                if let Err(why) = check(&case.text, &e) {
                    panic!(
                        "{what}: case {}: {why}\n--- input ---\n{}\n--- end ---",
                        case.index, case.text
                    );
                }
                refused += 1;
            }
        }
    }
    (ok, refused)
}

/// Checks that every line of `message` starts with `FILE:LINE:COL: ` (or `FILE:LINE: ` where
/// `col` is false) with a line inside `text` (or one past its end).
pub fn positioned(message: &str, file: &str, text: &str, col: bool) -> Result<(), String> {
    let last = text.lines().count().max(1) + 1;
    for line in message.lines() {
        let rest = line
            .strip_prefix(file)
            .and_then(|r| r.strip_prefix(':'))
            .ok_or_else(|| format!("error without `{file}:` in front: {line:?}"))?;
        let (l, rest) = rest
            .split_once(':')
            .ok_or_else(|| format!("error without a line: {line:?}"))?;
        let l: usize = l
            .parse()
            .map_err(|_| format!("error without a line number: {line:?}"))?;
        if l == 0 || l > last {
            return Err(format!("line {l} outside the input (1..={last}): {line:?}"));
        }
        if col {
            let (c, _) = rest
                .split_once(':')
                .ok_or_else(|| format!("error without a column: {line:?}"))?;
            let c: usize = c
                .parse()
                .map_err(|_| format!("error without a column number: {line:?}"))?;
            if c == 0 {
                return Err(format!("column 0: {line:?}"));
            }
        }
    }
    if message.trim().is_empty() {
        return Err("an empty error".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
