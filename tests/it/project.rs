//! What the project states about itself that its scripts and manifests could contradict: the
//! Kubernetes versions it is tested on, and its licence.

use crate::root;

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of the first Markdown table after `heading` (header and separator left out).
fn table_after<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    doc.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .collect()
}

#[test]
fn the_supported_versions_table_names_the_control_plane_the_tests_run() {
    let script = read("scripts/control-plane.sh");
    let version = script
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .expect("scripts/control-plane.sh pins KUBERNETES_VERSION")
        .trim();
    let minor = version
        .trim_start_matches('v')
        .rsplit_once('.')
        .expect("vMAJOR.MINOR.PATCH")
        .0;

    let operations = read("docs/operations.md");
    let rows = table_after(&operations, "## Supported Kubernetes versions");
    assert!(rows.len() >= 3, "{rows:?}");
    let tested: Vec<&&str> = rows.iter().filter(|r| r.contains("**tested**")).collect();
    assert_eq!(tested.len(), 1, "one tested version: {rows:?}");
    assert!(
        tested[0].starts_with(&format!("| {minor} |")) && tested[0].contains(version),
        "the tested row does not name {version}, the version scripts/control-plane.sh builds: {}",
        tested[0]
    );

    // The schema versions the deploy tests validate against, and the client's API version.
    let checked = rows
        .iter()
        .find(|r| r.contains("manifests checked"))
        .expect("a row of the versions the manifests are validated against");
    for v in crate::deploy::K8S_VERSIONS {
        let mm = v.rsplit_once('.').unwrap().0;
        assert!(
            checked.split('|').nth(1).unwrap().contains(mm),
            "{mm} (tests/it/deploy.rs) is not in {checked}"
        );
    }
    let controller = read("crates/controller/Cargo.toml");
    let api = controller
        .lines()
        .find(|l| l.starts_with("k8s-openapi"))
        .and_then(|l| l.split("\"v").nth(1))
        .and_then(|f| f.split('"').next())
        .expect("k8s-openapi's version feature");
    assert!(
        checked.contains(&format!("k8s-openapi `v{api}`")),
        "the client's API (v{api}) is not in {checked}"
    );
}

#[test]
fn the_licence_file_is_the_apache_2_0_cargo_declares() {
    let manifest = read("Cargo.toml");
    assert!(manifest.contains("\nlicense = \"Apache-2.0\"\n"));
    for member in [
        "crates/core",
        "crates/sim",
        "crates/controller",
        "crates/test-support",
        "providers/contract",
        "providers/memory",
        "providers/aws",
        "providers/alibaba",
        "providers/kwok",
        "simulations/kube-sim",
        "simulations/anchors",
    ] {
        assert!(
            read(&format!("{member}/Cargo.toml")).contains("\nlicense.workspace = true\n"),
            "{member} does not take the workspace's licence"
        );
        assert!(
            manifest.contains(&format!("\"{member}\"")),
            "{member} is not a workspace member"
        );
    }

    let licence = read("LICENSE");
    let words: Vec<&str> = licence.split_whitespace().collect();
    assert_eq!(
        &words[..6],
        ["Apache", "License", "Version", "2.0,", "January", "2004"]
    );
    let text = words.join(" ");
    let mut at = 0;
    for section in [
        "1. Definitions.",
        "2. Grant of Copyright License.",
        "3. Grant of Patent License.",
        "4. Redistribution.",
        "5. Submission of Contributions.",
        "6. Trademarks.",
        "7. Disclaimer of Warranty.",
        "8. Limitation of Liability.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
    ] {
        let found = text[at..]
            .find(section)
            .unwrap_or_else(|| panic!("LICENSE: no {section:?} after the previous section"));
        at += found + section.len();
    }
    // The terms, not a summary of them.
    assert!(words.len() > 1300, "LICENSE has {} words", words.len());
}
