//! The documentation cannot drift from the code: every field of the policy schema is described.

use crate::{cargo, root, run, stderr};
use std::collections::{BTreeMap, BTreeSet};

/// serde lists a struct's fields when it meets an unknown one; use that as the schema.
fn fields_of(yaml_with_unknown_field: &str) -> Vec<String> {
    let p = crate::temp_file("probe.yaml", yaml_with_unknown_field);
    let o = run(&["check-policy", p.to_str().unwrap()]);
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("unknown field"))
        .unwrap_or_else(|| panic!("no field list in: {err}"));
    let list = line.split("expected ").nth(1).unwrap();
    let list = list.strip_prefix("one of ").unwrap_or(list);
    list.split(", ")
        .flat_map(|f| f.split(" or "))
        .map(|f| f.trim_matches(|c| c == '`' || c == ' ').to_string())
        .collect()
}

#[test]
fn every_policy_field_is_in_the_policy_reference() {
    let doc = std::fs::read_to_string(root().join("docs/policy.md")).unwrap();
    let pool =
        "pools:\n  - name: x\n    instanceTypes: [g5.xlarge]\n    maxNodes: 1\n    zones: [a]\n";
    let probes = [
        ("", "zzz: 1\n".to_string()),
        ("limits.", format!("limits: {{zzz: 1}}\n{pool}")),
        ("batching.", format!("batching: {{zzz: 1}}\n{pool}")),
        ("", format!("{pool}    zzz: 1\n")),
        (
            "requirements.",
            format!("{pool}    requirements: {{zzz: 1}}\n"),
        ),
        ("scaleDown.", format!("{pool}    scaleDown: {{zzz: 1}}\n")),
        ("reserved.", format!("{pool}    reserved: {{zzz: 1}}\n")),
        ("sharedGpu.", format!("{pool}    sharedGpu: {{zzz: 1}}\n")),
        ("dra.", format!("{pool}    dra: {{zzz: 1}}\n")),
        ("disruption.", format!("{pool}    disruption: {{zzz: 1}}\n")),
        (
            "disruption.budgets[].",
            format!("{pool}    disruption: {{budgets: [{{zzz: 1}}]}}\n"),
        ),
        (
            "capacityReservations[].",
            format!("{pool}    capacityReservations: [{{zzz: 1}}]\n"),
        ),
    ];
    let mut checked = 0;
    for (prefix, yaml) in probes {
        for f in fields_of(&yaml) {
            let name = format!("`{prefix}{f}`");
            assert!(
                doc.contains(&name) || doc.contains(&format!("`{prefix}{f}.")),
                "docs/policy.md does not describe {name}"
            );
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} fields found");
}

#[test]
fn readme_gives_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("bash scripts/test.sh"));
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.contains("scripts/test.sh"));
    // The main job: the built-in simulation.
    assert!(readme.contains("\ncargo run -- simulate\n"));
}

/// The ```json blocks of a Markdown text, parsed (a block that does not parse fails the test,
/// naming its line).
fn json_blocks(doc: &str, file: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut block: Option<(usize, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        match &mut block {
            None if line.trim() == "```json" => block = Some((i + 1, String::new())),
            Some((start, text)) if line.trim() == "```" => {
                let v = serde_json::from_str(text).unwrap_or_else(|e| {
                    panic!("{file}:{}: the JSON block does not parse: {e}", *start + 1)
                });
                out.push(v);
                block = None;
            }
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    assert!(block.is_none(), "{file}: a ```json block is not closed");
    out
}

/// The SQS operations `interruptions.rs` calls on its client, as IAM names them
/// (`.receive_message()` → `sqs:ReceiveMessage`).
fn sqs_calls_in(source: &str) -> std::collections::BTreeSet<String> {
    let mut calls = std::collections::BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find(".client") {
        rest = &rest[at + ".client".len()..];
        let call = rest.trim_start();
        let Some(call) = call.strip_prefix('.') else {
            continue;
        };
        let name: String = call
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if name.is_empty() || !call[name.len()..].starts_with('(') {
            continue;
        }
        let camel: String = name
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect();
        calls.insert(format!("sqs:{camel}"));
    }
    calls
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

#[test]
fn the_interruption_queue_set_up_matches_what_the_controller_reads_and_calls() {
    use gpu_node_autoscaler_aws::interruptions::{parse_event, Parsed};
    use gpu_node_autoscaler_provider::NoticeKind;

    let doc = std::fs::read_to_string(root().join("docs/aws.md")).unwrap();
    let blocks = json_blocks(&doc, "docs/aws.md");

    // The controller's statement for the queue: exactly the SQS calls the code makes.
    let source =
        std::fs::read_to_string(root().join("providers/aws/src/interruptions.rs")).unwrap();
    let called = sqs_calls_in(&source);
    assert!(
        called.contains("sqs:ReceiveMessage") && called.contains("sqs:DeleteMessage"),
        "{called:?}"
    );
    let statement = blocks
        .iter()
        .find(|b| b["Sid"] == "ReadInterruptionQueue")
        .expect("docs/aws.md: the ReadInterruptionQueue statement");
    let granted: std::collections::BTreeSet<String> =
        strings(&statement["Action"]).into_iter().collect();
    assert_eq!(
        granted, called,
        "docs/aws.md: ReadInterruptionQueue grants other actions than interruptions.rs calls"
    );
    assert_eq!(statement["Effect"], "Allow");
    assert!(
        statement["Resource"]
            .as_str()
            .is_some_and(|r| r.starts_with("arn:aws:sqs:")),
        "one queue, not *: {statement}"
    );

    // The queue policy lets EventBridge send, from the rules only.
    let queue_policy = blocks
        .iter()
        .flat_map(|b| b["Statement"].as_array().into_iter().flatten())
        .find(|s| s["Principal"]["Service"] == "events.amazonaws.com")
        .expect("docs/aws.md: a queue policy statement for events.amazonaws.com");
    assert_eq!(strings(&queue_policy["Action"]), ["sqs:SendMessage"]);
    assert_eq!(queue_policy["Effect"], "Allow");
    let rules = strings(&queue_policy["Condition"]["ArnEquals"]["aws:SourceArn"]);
    assert_eq!(rules.len(), 4, "{queue_policy}");
    assert!(rules.iter().all(|r| r.starts_with("arn:aws:events:")));

    // Each event pattern, filled in with the first value of each field it matches on, is an
    // event the controller turns into a notice; the four kinds are covered.
    let patterns: Vec<&serde_json::Value> = blocks
        .iter()
        .filter(|b| b.get("source").is_some() && b.get("detail-type").is_some())
        .collect();
    assert_eq!(patterns.len(), 4, "docs/aws.md: four event patterns");
    let mut kinds = std::collections::BTreeSet::new();
    for (i, p) in patterns.iter().enumerate() {
        let first = |v: &serde_json::Value| strings(v).into_iter().next().unwrap_or_default();
        let mut detail = serde_json::json!({
            "instance-id": "i-0123456789abcdef0",
            "affectedEntities": [{"entityValue": "i-0123456789abcdef0"}],
        });
        if let Some(fields) = p["detail"].as_object() {
            for (k, v) in fields {
                detail[k] = serde_json::Value::String(first(v));
            }
        }
        let event = serde_json::json!({
            "version": "0",
            "id": format!("docs-{i}"),
            "detail-type": first(&p["detail-type"]),
            "source": first(&p["source"]),
            "account": "123456789012",
            "time": "2026-11-24T12:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": detail,
        });
        match parse_event("m", &event.to_string()) {
            Ok(Parsed::Notice(n)) => {
                kinds.insert(n.kind);
            }
            other => panic!("docs/aws.md: the pattern {p} matches events read as {other:?}"),
        }
    }
    assert_eq!(
        kinds,
        [
            NoticeKind::SpotInterruption,
            NoticeKind::Rebalance,
            NoticeKind::ScheduledChange,
            NoticeKind::Stopping
        ]
        .into_iter()
        .collect()
    );
}

/// A workspace crate's name in the dependency table: without the common prefix.
fn short_name(package: &str) -> &str {
    package
        .strip_prefix("gpu-node-autoscaler-")
        .unwrap_or(package)
}

/// What the manifests say: each crate from outside the workspace → the workspace crates that
/// name it, as the table writes them (`core`, `core (dev)`).
fn direct_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let out = cargo(&[
        "metadata",
        "--no-deps",
        "--offline",
        "--format-version",
        "1",
    ]);
    let meta: serde_json::Value = serde_json::from_str(&out).expect("cargo metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    // (dependency, user) → kinds (normal, dev, build).
    let mut kinds: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for p in packages {
        let user = short_name(p["name"].as_str().expect("package name"));
        for d in p["dependencies"].as_array().expect("dependencies") {
            let name = d["name"].as_str().expect("dependency name");
            if members.contains(name) {
                continue;
            }
            let kind = d["kind"].as_str().unwrap_or("normal");
            kinds
                .entry((name.to_string(), user.to_string()))
                .or_default()
                .insert(kind.to_string());
        }
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((name, user), kinds) in kinds {
        let entry = if kinds.contains("normal") {
            user
        } else {
            format!(
                "{user} ({})",
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            )
        };
        out.entry(name).or_default().insert(entry);
    }
    out
}

/// The rows of the table under `## Dependencies`: crate → the "used by" column.
fn dependency_table(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let section = doc
        .split("\n## Dependencies\n")
        .nth(1)
        .expect("docs/architecture.md has a Dependencies section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a row without its three columns: {line}");
        let name = cells[1].trim_matches('`').to_string();
        assert!(!cells[3].is_empty(), "{name}: the row does not say why");
        let users: BTreeSet<String> = cells[2].split(", ").map(str::to_string).collect();
        assert!(
            rows.insert(name.clone(), users).is_none(),
            "{name} has two rows"
        );
    }
    rows
}

#[test]
fn every_direct_dependency_has_a_row_in_the_architecture_dependency_table() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let table = dependency_table(&doc);
    let manifests = direct_dependencies();
    assert!(
        manifests.len() > 20,
        "only {} dependencies found",
        manifests.len()
    );
    let missing: Vec<&String> = manifests
        .keys()
        .filter(|d| !table.contains_key(*d))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md has no row for {missing:?}"
    );
    let stale: Vec<&String> = table
        .keys()
        .filter(|d| !manifests.contains_key(*d))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/architecture.md has rows for {stale:?}, which no workspace crate depends on"
    );
    for (name, users) in &manifests {
        assert_eq!(
            &table[name], users,
            "docs/architecture.md: the crates that use {name}"
        );
    }
}

/// A clone alone runs every documented command: no path outside the repository in README, the
/// docs or the benchmarks.
#[test]
fn readme_docs_and_benches_name_no_path_outside_the_repository() {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "crates/sim/benches", "crates/core/benches"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md" || x == "rs") {
                files.push(p);
            }
        }
    }
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains("../shared"),
            "{} reads ../shared, outside the repository",
            f.display()
        );
    }
    // The traces they replay ship, with their attribution.
    for t in ["default", "gpushare40", "multigpu40"] {
        assert!(root()
            .join(format!(
                "simulations/traces/alibaba-gpu-v2023/openb_pod_list_{t}.csv"
            ))
            .is_file());
    }
    let notice = std::fs::read_to_string(root().join("NOTICE")).unwrap();
    assert!(notice.contains("CC BY 4.0") && notice.contains("Alibaba Group"));
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors_of(text: &str) -> std::collections::BTreeSet<String> {
    let mut fence = false;
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            if heading.starts_with(' ') {
                out.insert(heading_anchor(heading));
            }
        }
    }
    out
}

/// Every Markdown file of README and docs/ (with docs/history/).
fn markdown_files() -> Vec<std::path::PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// A newcomer follows links: every relative link of README, CHANGELOG and docs/ names a file
/// or folder of the repository, and its `#anchor`, a heading of that file.
#[test]
fn every_relative_link_in_the_docs_resolves_to_a_file_and_heading() {
    let link = regex_lite_links;
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in link(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{}: {target}: no such file", file.display()));
                continue;
            }
            if let Some(a) = anchor {
                if resolved.extension().is_some_and(|x| x == "md") {
                    let anchors = anchors_of(&std::fs::read_to_string(&resolved).unwrap());
                    if !anchors.contains(a) {
                        broken.push(format!("{}: {target}: no such heading", file.display()));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The targets of the inline links `[text](target)` of a Markdown text, outside code blocks and
/// code spans.
fn regex_lite_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Code spans hold no links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
            plain.push(' ');
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            match after.find(')') {
                Some(end) => {
                    let target = after[..end].trim();
                    if !target.is_empty() && !target.contains(' ') {
                        out.push(target.to_string());
                    }
                    rest = &after[end..];
                }
                None => break,
            }
        }
    }
    out
}
