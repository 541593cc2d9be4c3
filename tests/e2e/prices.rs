//! Prices refreshed while the policy stays the same (`--price-refresh-interval`): a spot price
//! that changes in the EC2 spot price history is in force at the next refresh, and a failed
//! read keeps the last good prices. A region without a built-in catalog is warned about. moto answers `DescribeSpotPriceHistory` with one fixed
//! price, so the fault proxy in front of it rewrites the price (the rest is moto's).

use std::time::Duration;

use crate::support::{Env, FaultProxy, Options};

const MIN: Duration = Duration::from_secs(60);
const SPOT_A: &str = "gpu_node_autoscaler_offering_price_dollars_per_hour{instance_type=\"g5.xlarge\",zone=\"us-east-1a\",capacity_type=\"spot\"}";
const FAILED_READS: &str =
    "gpu_node_autoscaler_price_refreshes_total{provider=\"aws\",result=\"error\"}";

fn proxy(env: &Env) -> &FaultProxy {
    env.proxy.as_ref().expect("started with the proxy")
}

fn spot_price_becomes(env: &Env, what: &str, price: f64) {
    env.wait_for(what, MIN, || {
        env.metric("r1", SPOT_A)
            .filter(|p| (p - price).abs() < 1e-9)
    });
}

#[test]
fn a_changed_spot_price_is_in_force_at_the_next_refresh_without_a_policy_change() {
    let mut env = Env::start(
        "prices",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    proxy(&env).set_spot_price("g5.xlarge", "us-east-1a", "0.52");
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a", "us-east-1b"], "")));
    env.start_controller("r1", &["--price-refresh-interval", "1s"]);
    spot_price_becomes(&env, "the spot price read with the policy", 0.52);

    // The history changes; the policy does not.
    proxy(&env).set_spot_price("g5.xlarge", "us-east-1a", "0.31");
    spot_price_becomes(&env, "the changed spot price", 0.31);
    let log = env.log("r1");
    assert_eq!(
        log.matches("policy in force").count(),
        1,
        "the policy was applied once: {log}"
    );
    assert!(log.contains("price changed"), "{log}");

    // The spot price history cannot be read: the last good prices stay.
    proxy(&env).fail("DescribeSpotPriceHistory", u32::MAX);
    proxy(&env).set_spot_price("g5.xlarge", "us-east-1a", "0.2");
    let failed = env.metric("r1", FAILED_READS).unwrap_or(0.0);
    env.wait_for("two failed reads", MIN, || {
        env.metric("r1", FAILED_READS)
            .filter(|n| *n >= failed + 2.0)
    });
    assert_eq!(env.metric("r1", SPOT_A), Some(0.31));
    assert!(
        env.log("r1").contains("the last good prices stay in force"),
        "{}",
        env.log("r1")
    );

    // Readable again: the new price is in force.
    proxy(&env).fail("DescribeSpotPriceHistory", 0);
    spot_price_becomes(&env, "the spot price read after the failures", 0.2);
    env.terminate("r1");
}

#[test]
fn a_region_without_a_builtin_catalog_is_warned_about_on_the_policy_configmap() {
    let mut env = Env::start("region", Options::default());
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("region: us-east-1\n", "region: eu-west-1\n");
    assert!(policy.contains("region: eu-west-1\n"));
    env.create(&env.policy_configmap(&policy));
    // Dry run: the built-in catalog is the catalog in force, and no cloud is asked.
    env.start_controller("r1", &["--dry-run"]);
    let events = env.wait_for("the BuiltinCatalogFallback Event", MIN, || {
        Some(env.events("BuiltinCatalogFallback")).filter(|e| !e.is_empty())
    });
    assert!(
        events[0].starts_with(
            "gpu-node-autoscaler-policy: no built-in catalog for region eu-west-1: the built-in \
             aws us-east-1 list prices are used instead"
        ),
        "{events:?}"
    );
    assert!(
        env.log("r1")
            .contains("no built-in catalog for region eu-west-1"),
        "{}",
        env.log("r1")
    );
    env.terminate("r1");
}
