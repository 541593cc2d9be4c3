//! `check-policy --provider alibaba` against the Alibaba Cloud provider's local fake of the ESS,
//! ECS and VPC endpoints (which checks every request's signature).

use gpu_node_autoscaler_test_support::ess as support;

use std::process::Output;

use support::{Fake, KEY_ID, SECRET, TOKEN};

use crate::{bin, stderr, stdout, temp_file};

const A10: &str = "ecs.gn7i-c8g1.2xlarge";

fn policy(name: &str, alibaba: &str, extra: &str) -> std::path::PathBuf {
    temp_file(
        name,
        &format!(
            "region: cn-hangzhou\nzones: [cn-hangzhou-i, cn-hangzhou-j]\npools:\n  - name: a10\n    \
             provider: alibaba\n    instanceTypes: [{A10}]\n    capacityTypes: [spot, on-demand]\n    \
             maxNodes: 4\n{extra}    alibaba:\n{alibaba}"
        ),
    )
}

const PRICES: &str = "    prices: {ecs.gn7i-c8g1.2xlarge: {onDemand: 2.0}}\n";

fn check(file: &std::path::Path, fake: &Fake) -> Output {
    bin()
        .args([
            "check-policy",
            file.to_str().unwrap(),
            "--provider",
            "alibaba",
        ])
        .args(["--alibaba-endpoint-url", &fake.url])
        .env("ALIBABA_CLOUD_ACCESS_KEY_ID", KEY_ID)
        .env("ALIBABA_CLOUD_ACCESS_KEY_SECRET", SECRET)
        .env("ALIBABA_CLOUD_SECURITY_TOKEN", TOKEN)
        .env_remove("ALIBABA_CLOUD_ROLE_ARN")
        .env_remove("ALIBABA_CLOUD_OIDC_PROVIDER_ARN")
        .env_remove("ALIBABA_CLOUD_OIDC_TOKEN_FILE")
        .output()
        .unwrap()
}

fn assert_clean(fake: &Fake) {
    let v = fake.with(|s| s.violations.clone());
    assert!(v.is_empty(), "the fake saw bad requests: {v:#?}");
}

#[test]
fn check_policy_with_provider_alibaba_passes_for_a_matching_account() {
    let fake = Fake::start_blocking(&[("asg-bp1spot", &["cn-hangzhou-i", "cn-hangzhou-j"])]);
    fake.with(|s| {
        s.groups
            .get_mut("asg-bp1spot")
            .unwrap()
            .compensate_with_on_demand = true
    });
    let file = policy(
        "ali-ok.yaml",
        "      scalingGroupId: asg-bp1spot\n      compensateWithOnDemand: true\n      \
         vSwitches: {cn-hangzhou-i: vsw-0, cn-hangzhou-j: vsw-1}\n",
        PRICES,
    );
    let o = check(&file, &fake);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("pool a10: alibaba"), "{}", stdout(&o));
    let groups = fake.with(|s| s.calls_of("DescribeScalingGroups"));
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["ScalingGroupId.1"], "asg-bp1spot");
    assert_eq!(fake.with(|s| s.calls_of("DescribeVSwitches")).len(), 2);
    assert_clean(&fake);
}

#[test]
fn check_policy_with_provider_alibaba_names_what_the_account_lacks() {
    let fake = Fake::start_blocking(&[("asg-bp1spot", &["cn-hangzhou-i", "cn-hangzhou-j"])]);
    let file = policy(
        "ali-bad.yaml",
        "      scalingGroupId: asg-bp1spot\n      onDemandScalingGroupId: asg-bp1gone\n      \
         vSwitches: {cn-hangzhou-i: vsw-0, cn-hangzhou-j: vsw-9}\n",
        PRICES,
    );
    let o = check(&file, &fake);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let f = file.display().to_string();
    for want in [
        format!(
            "{f}: pool a10: alibaba.onDemandScalingGroupId: scaling group asg-bp1gone not found \
             in region cn-hangzhou"
        ),
        format!(
            "{f}: pool a10: alibaba.vSwitches.cn-hangzhou-j: vSwitch vsw-9 is not a vSwitch of \
             scaling group asg-bp1spot"
        ),
        format!(
            "{f}: pool a10: alibaba.vSwitches.cn-hangzhou-j: vSwitch vsw-9 not found in region \
             cn-hangzhou"
        ),
    ] {
        assert!(err.contains(&want), "missing {want:?} in\n{err}");
    }
    assert!(
        err.contains("3 problem(s) with the Alibaba Cloud account"),
        "{err}"
    );
    assert_clean(&fake);
}

#[test]
fn check_policy_with_provider_alibaba_needs_prices_and_a_region() {
    let fake = Fake::start_blocking(&[("asg-bp1spot", &["cn-hangzhou-i", "cn-hangzhou-j"])]);
    let section = "      scalingGroupId: asg-bp1spot\n      compensateWithOnDemand: true\n      \
                   vSwitches: {cn-hangzhou-i: vsw-0, cn-hangzhou-j: vsw-1}\n";
    let file = policy("ali-noprice.yaml", section, "");
    let o = check(&file, &fake);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "pool a10: prices.{A10}.onDemand: no on-demand price for {A10}"
        )),
        "{err}"
    );
    assert!(
        fake.with(|s| s.calls.is_empty()),
        "nothing asked of the account"
    );
    let text = std::fs::read_to_string(policy("ali-noregion.yaml", section, PRICES)).unwrap();
    let file = temp_file(
        "ali-noregion.yaml",
        &text.replace("region: cn-hangzhou\n", ""),
    );
    let o = check(&file, &fake);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--provider alibaba needs the policy's `region`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn every_alibaba_policy_field_is_in_the_policy_reference() {
    // serde names the section's fields when it meets an unknown one.
    let probe = policy("ali-probe.yaml", "      zzz: 1\n", "");
    let o = crate::run(&["check-policy", probe.to_str().unwrap()]);
    let err = stderr(&o);
    let listed = err
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("no field list in: {err}"));
    let fields: Vec<&str> = listed
        .lines()
        .next()
        .unwrap()
        .split(", ")
        .map(|f| f.trim_matches(|c| c == '`' || c == ' '))
        .collect();
    assert_eq!(fields.len(), 4, "{fields:?}");
    let doc = std::fs::read_to_string(crate::root().join("docs/policy.md")).unwrap();
    for f in fields {
        assert!(
            doc.contains(&format!("`alibaba.{f}`")),
            "docs/policy.md does not describe `alibaba.{f}`"
        );
    }
}
