//! The documentation cannot drift from the code: every field of the policy schema is described.

use crate::{root, run, stderr};

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
