//! The provider against a local fake of the ESS and ECS endpoints (`support`), which checks
//! every request's signature and parameters.

use gpu_node_autoscaler_test_support::ess as support;

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_node_autoscaler_alibaba::{
    AlibabaConfig, AlibabaPool, AlibabaProvider, Credentials, RetryPolicy,
};
use gpu_node_autoscaler_provider::{
    CapacityType, CloudProvider, GpuVendor, InstanceState, LaunchRequest, OfferingKey,
    ProviderError,
};
use support::{Fake, KEY_ID, SECRET, TOKEN};

const A10: &str = "ecs.gn7i-c8g1.2xlarge";
const T4: &str = "ecs.gn6i-c4g1.xlarge";
const ZONES: [&str; 2] = ["cn-hangzhou-i", "cn-hangzhou-j"];

fn pool(on_demand_group: bool) -> AlibabaPool {
    AlibabaPool {
        name: "gpu".into(),
        scaling_group: "asg-spot".into(),
        capacity_type: CapacityType::Spot,
        compensate_with_on_demand: false,
        on_demand_group: on_demand_group.then(|| "asg-od".to_string()),
        instance_types: vec![A10.into(), T4.into()],
        vswitches: ZONES
            .iter()
            .enumerate()
            .map(|(i, z)| (z.to_string(), format!("vsw-{i}")))
            .collect(),
        on_demand_prices: [(A10.to_string(), 2.0), (T4.to_string(), 1.0)].into(),
    }
}

async fn setup(on_demand_group: bool, page_size: u32) -> (Fake, AlibabaProvider) {
    let fake = Fake::start(&[("asg-spot", &ZONES), ("asg-od", &ZONES)]).await;
    let provider = provider_for(&fake, on_demand_group, page_size, None);
    (fake, provider)
}

/// A provider of the fake's groups with quick retries, for the cluster `cluster_id`.
fn provider_for(
    fake: &Fake,
    on_demand_group: bool,
    page_size: u32,
    cluster_id: Option<&str>,
) -> AlibabaProvider {
    let mut config = config_for(fake);
    config.cluster_id = cluster_id.map(str::to_string);
    config.pools.push(pool(on_demand_group));
    config.retry = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    };
    config.busy_retry = RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    };
    config.activity_poll_interval = Duration::from_millis(1);
    config.activity_timeout = Duration::from_secs(10);
    config.page_size = page_size;
    AlibabaProvider::new(config, creds()).unwrap()
}

/// A configuration whose ESS, ECS and VPC endpoints are the fake.
fn config_for(fake: &Fake) -> AlibabaConfig {
    let mut config = AlibabaConfig::new("cn-hangzhou");
    config.ess_endpoint = Some(fake.url.clone());
    config.ecs_endpoint = Some(fake.url.clone());
    config.vpc_endpoint = Some(fake.url.clone());
    config
}

fn creds() -> Credentials {
    let mut creds = Credentials::new(KEY_ID, SECRET);
    creds.security_token = Some(TOKEN.into());
    creds
}

fn request(launch_id: &str, count: u32) -> LaunchRequest {
    let key = |t: &str, ct| OfferingKey {
        instance_type: t.into(),
        zone: ZONES[0].into(),
        capacity_type: ct,
    };
    LaunchRequest {
        launch_id: launch_id.into(),
        pool: "gpu".into(),
        count,
        offerings: vec![
            key(A10, CapacityType::Spot),
            key(T4, CapacityType::Spot),
            key(A10, CapacityType::OnDemand),
        ],
        tags: BTreeMap::new(),
        reservations: Vec::new(),
        atomic: false,
    }
}

fn assert_clean(fake: &Fake) {
    let v = fake.with(|s| s.violations.clone());
    assert!(v.is_empty(), "the fake saw bad requests: {v:#?}");
}

#[tokio::test]
async fn catalog_has_shapes_spot_and_on_demand_prices() {
    let (fake, p) = setup(true, 50).await;
    fake.with(|s| {
        let od1 = s.stock.get_mut(&(ZONES[1].to_string(), false)).unwrap();
        od1.retain(|(t, _)| t != A10);
        od1.iter_mut()
            .for_each(|(_, cat)| *cat = "WithoutStock".into());
    });
    let c = p.catalog().await.unwrap();
    let a10 = c.instance_type(A10).unwrap();
    assert_eq!((a10.vcpu, a10.memory_mib), (8, 30 * 1024));
    let gpu = a10.gpu.as_ref().unwrap();
    assert_eq!(
        (gpu.model.as_str(), gpu.vendor, gpu.count, gpu.memory_mib),
        ("A10", GpuVendor::Nvidia, 1, 24 * 1024)
    );
    assert_eq!(a10.on_demand_price, Some(2.0));
    assert_eq!(
        c.instance_type(T4).unwrap().gpu.as_ref().unwrap().model,
        "T4"
    );
    let find = |t: &str, z: &str, ct| {
        c.offerings
            .iter()
            .find(|o| o.key.instance_type == t && o.key.zone == z && o.key.capacity_type == ct)
            .unwrap()
            .clone()
    };
    // The latest spot price wins; without a spot price, the on-demand price (SpotAsPriceGo's
    // ceiling). ClosedWithStock is still available.
    let s = find(A10, ZONES[0], CapacityType::Spot);
    assert_eq!((s.price_per_hour, s.available), (0.5, true));
    let s = find(A10, ZONES[1], CapacityType::Spot);
    assert_eq!((s.price_per_hour, s.available), (2.0, true));
    assert!(find(T4, ZONES[0], CapacityType::Spot).available);
    // WithoutStock: listed, unavailable.
    let od = find(T4, ZONES[1], CapacityType::OnDemand);
    assert_eq!((od.price_per_hour, od.available), (1.0, false));
    assert!(find(T4, ZONES[1], CapacityType::Spot).available);
    // Not offered in the zone at all (spot): no such offering.
    assert!(!c.offerings.iter().any(|o| o.key.instance_type == A10
        && o.key.zone == ZONES[1]
        && o.key.capacity_type == CapacityType::OnDemand));
    assert_eq!(c.offerings.len(), 2 * 2 * 2 - 1);
    let stock = fake.with(|s| s.calls_of("DescribeAvailableResource"));
    assert_eq!(stock.len(), 4, "one per zone and spot strategy: {stock:?}");
    for c in &stock {
        assert_eq!(c["DestinationResource"], "InstanceType");
        assert_eq!(c["InstanceChargeType"], "PostPaid");
    }
    let calls = fake.with(|s| s.calls_of("DescribeInstanceTypes"));
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].get("InstanceTypes.1").map(String::as_str),
        Some(T4)
    );
    assert_eq!(
        fake.with(|s| s.calls_of("DescribeSpotPriceHistory")).len(),
        2
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn an_on_demand_only_pool_has_no_spot_offerings_and_asks_no_spot_prices() {
    let fake = Fake::start(&[("asg-od", &ZONES)]).await;
    let mut config = config_for(&fake);
    let mut p = pool(false);
    p.scaling_group = "asg-od".into();
    p.capacity_type = CapacityType::OnDemand;
    config.pools.push(p);
    config.activity_poll_interval = Duration::from_millis(1);
    let provider = AlibabaProvider::new(config, creds()).unwrap();
    let c = provider.catalog().await.unwrap();
    assert_eq!(c.offerings.len(), 4);
    assert!(c
        .offerings
        .iter()
        .all(|o| o.key.capacity_type == CapacityType::OnDemand && o.available));
    assert!(fake
        .with(|s| s.calls_of("DescribeSpotPriceHistory"))
        .is_empty());
    let r = provider.launch(&request("od-1", 2)).await.unwrap();
    assert_eq!(r.launched.len(), 2);
    assert!(r
        .launched
        .iter()
        .all(|i| i.offering.capacity_type == CapacityType::OnDemand));
    assert_clean(&fake);
}

#[tokio::test]
async fn catalog_names_types_without_on_demand_price() {
    let fake = Fake::start(&[("asg-spot", &ZONES)]).await;
    let mut config = config_for(&fake);
    let mut p = pool(false);
    p.on_demand_prices.remove(T4);
    config.pools.push(p);
    let provider = AlibabaProvider::new(config, creds()).unwrap();
    let e = provider.catalog().await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::InvalidRequest { message } if message.contains("gpu/ecs.gn6i-c4g1.xlarge")),
        "{e}"
    );
}

#[tokio::test]
async fn launch_scales_the_spot_group_and_reports_its_instances() {
    let (fake, p) = setup(true, 50).await;
    let r = p.launch(&request("launch-1", 3)).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.launched.len(), 3);
    for i in &r.launched {
        assert_eq!(i.provider_id, format!("cn-hangzhou.{}", i.id));
        assert_eq!(i.offering.capacity_type, CapacityType::Spot);
        assert_eq!(i.launch_id, "launch-1");
        assert_eq!(i.pool, "gpu");
        assert_eq!(i.state, InstanceState::Running);
        assert!(ZONES.contains(&i.offering.zone.as_str()));
    }
    // The type ESS picked, from ECS DescribeInstances (the listing does not say it).
    let mut types: Vec<&str> = r
        .launched
        .iter()
        .map(|i| i.offering.instance_type.as_str())
        .collect();
    types.sort();
    assert_eq!(types, [T4, A10, A10]);
    let described = fake.with(|s| s.calls_of("DescribeInstances"));
    assert_eq!(described.len(), 1);
    assert_eq!(
        serde_json::from_str::<Vec<String>>(&described[0]["InstanceIds"])
            .unwrap()
            .len(),
        3
    );
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert_eq!(scale.len(), 1);
    assert_eq!(scale[0]["ScalingGroupId"], "asg-spot");
    assert_eq!(scale[0]["AdjustmentType"], "QuantityChangeInCapacity");
    assert_eq!(scale[0]["AdjustmentValue"], "3");
    assert!(scale[0]["ClientToken"].len() <= 64);
    assert!(scale[0]["ActivityMetadata"].contains("launch-1"));
    // The activity was InProgress once, then polled again.
    assert!(fake.with(|s| s.calls_of("DescribeScalingActivities")).len() >= 2);
    assert_eq!(fake.with(|s| s.groups["asg-od"].instances.len()), 0);
    // list() finds them again with their launch id (crash recovery).
    let listed = p.list("gpu").await.unwrap();
    let mut ids: Vec<_> = listed
        .iter()
        .map(|i| (i.id.clone(), i.launch_id.clone()))
        .collect();
    let mut want: Vec<_> = r
        .launched
        .iter()
        .map(|i| (i.id.clone(), i.launch_id.clone()))
        .collect();
    ids.sort();
    want.sort();
    assert_eq!(ids, want);
    assert_clean(&fake);
}

#[tokio::test]
async fn repeated_launch_id_creates_nothing_twice() {
    let (fake, p) = setup(true, 50).await;
    let first = p.launch(&request("launch-1", 2)).await.unwrap();
    assert_eq!(first.launched.len(), 2);
    // The repeat finds the launch id's activity and its instances: nothing is asked again.
    let again = p.launch(&request("launch-1", 2)).await.unwrap();
    assert!(
        again.launched.is_empty() && again.failures.is_empty(),
        "{again:?}"
    );
    assert_eq!(fake.with(|s| s.groups["asg-spot"].instances.len()), 2);
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 1);
    // Asking for more under the same launch id asks only for the difference, with a new token.
    let more = p.launch(&request("launch-1", 3)).await.unwrap();
    assert_eq!(more.launched.len(), 1);
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert_eq!(scale.len(), 2);
    assert_eq!(scale[1]["AdjustmentValue"], "1");
    assert_ne!(scale[0]["ClientToken"], scale[1]["ClientToken"]);
    // Removed instances still count: the launch id created them.
    p.terminate(&first.launched[0].id).await.unwrap();
    let after = p.launch(&request("launch-1", 3)).await.unwrap();
    assert!(after.launched.is_empty(), "{after:?}");
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 2);
    // Another launch id is another scale-out.
    p.launch(&request("launch-2", 1)).await.unwrap();
    assert_eq!(fake.with(|s| s.groups["asg-spot"].instances.len()), 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn no_stock_on_spot_fails_the_spot_offerings_and_uses_the_on_demand_group() {
    let (fake, p) = setup(true, 50).await;
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().no_stock = true);
    let r = p.launch(&request("launch-ice", 2)).await.unwrap();
    assert_eq!(r.launched.len(), 2);
    assert!(r
        .launched
        .iter()
        .all(|i| i.offering.capacity_type == CapacityType::OnDemand));
    let failed: Vec<_> = r
        .failures
        .iter()
        .map(|(k, e)| (k.instance_type.as_str(), k.capacity_type, e.clone()))
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    for (k, e) in &r.failures {
        assert_eq!(k.capacity_type, CapacityType::Spot);
        assert_eq!(
            e,
            &ProviderError::InsufficientCapacity {
                offering: k.clone()
            }
        );
    }
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert_eq!(scale.len(), 2);
    assert_eq!(scale[1]["ScalingGroupId"], "asg-od");
    assert_eq!(scale[1]["AdjustmentValue"], "2");
    assert_ne!(scale[0]["ClientToken"], scale[1]["ClientToken"]);
    assert_eq!(fake.with(|s| s.groups["asg-od"].instances.len()), 2);
    assert_clean(&fake);
}

#[tokio::test]
async fn no_stock_without_on_demand_group_is_reported_not_raised() {
    let (fake, p) = setup(false, 50).await;
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().no_stock = true);
    let r = p.launch(&request("launch-ice", 1)).await.unwrap();
    assert!(r.launched.is_empty());
    assert_eq!(r.failures.len(), 2);
    assert!(r
        .failures
        .iter()
        .all(|(_, e)| e.metric_label() == "insufficient_capacity"));
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn throttling_is_retried_then_surfaced() {
    let (fake, p) = setup(true, 50).await;
    // Two Throttling.User answers, then success: within the 3 attempts.
    fake.with(|s| s.throttle.insert("ScaleWithAdjustment".into(), 2));
    let r = p.launch(&request("launch-t", 1)).await.unwrap();
    assert_eq!(r.launched.len(), 1);
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 3);
    // Throttled for longer than the retries last: Throttled, after exactly 3 attempts.
    fake.with(|s| s.throttle.insert("DescribeScalingInstances".into(), 10));
    let before = fake.with(|s| s.calls_of("DescribeScalingInstances")).len();
    let e = p.list("gpu").await.unwrap_err();
    assert!(
        matches!(
            e,
            ProviderError::Throttled {
                retry_after: Some(_)
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        fake.with(|s| s.calls_of("DescribeScalingInstances")).len() - before,
        3
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn terminate_removes_exactly_that_instance() {
    let (fake, p) = setup(true, 50).await;
    let r = p.launch(&request("launch-1", 3)).await.unwrap();
    let victim = r.launched[1].clone();
    // By provider id, as the node carries it.
    p.terminate(&victim.provider_id).await.unwrap();
    let removes = fake.with(|s| s.calls_of("RemoveInstances"));
    assert_eq!(removes.len(), 1);
    assert_eq!(removes[0]["ScalingGroupId"], "asg-spot");
    assert_eq!(removes[0]["InstanceIds.1"], victim.id);
    assert!(!removes[0].contains_key("InstanceIds.2"));
    let left: Vec<String> = fake.with(|s| {
        s.groups["asg-spot"]
            .instances
            .iter()
            .map(|i| i.id.clone())
            .collect()
    });
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&victim.id));
    // Already gone: Ok, and no second RemoveInstances.
    p.terminate(&victim.id).await.unwrap();
    p.terminate("i-neverexisted").await.unwrap();
    assert_eq!(fake.with(|s| s.calls_of("RemoveInstances")).len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn list_reads_every_page() {
    let (fake, p) = setup(true, 2).await;
    p.launch(&request("launch-1", 5)).await.unwrap();
    let before = fake.with(|s| s.calls_of("DescribeScalingInstances")).len();
    let listed = p.list("gpu").await.unwrap();
    assert_eq!(listed.len(), 5);
    let calls = fake.with(|s| s.calls_of("DescribeScalingInstances"));
    let spot_pages: Vec<String> = calls[before..]
        .iter()
        .filter(|c| c["ScalingGroupId"] == "asg-spot")
        .map(|c| c["PageNumber"].clone())
        .collect();
    assert_eq!(spot_pages, ["1", "2", "3"]);
    assert!(calls[before..].iter().all(|c| c["PageSize"] == "2"));
    assert!(listed.iter().all(|i| i.launch_id == "launch-1"));
    let e = p.list("nope").await.unwrap_err();
    assert_eq!(e.metric_label(), "invalid_request");
    assert_clean(&fake);
}

#[tokio::test]
async fn a_wrong_secret_is_refused_by_the_fake() {
    let (fake, _) = setup(true, 50).await;
    let mut config = config_for(&fake);
    config.pools.push(pool(true));
    let bad = AlibabaProvider::new(config, Credentials::new(KEY_ID, "wrong")).unwrap();
    let e = bad.list("gpu").await.unwrap_err();
    assert_eq!(e.metric_label(), "invalid_request");
    assert!(e.to_string().contains("SignatureDoesNotMatch"), "{e}");
    assert!(!format!("{bad:?}").contains("wrong"));
    assert_eq!(fake.with(|s| s.violations.len()), 1);
}

#[tokio::test]
async fn concurrent_launches_on_one_group_are_queued_not_refused() {
    let (fake, p) = setup(true, 50).await;
    // Each activity stays InProgress for 3 polls: ESS refuses another one meanwhile.
    fake.with(|s| s.activity_polls = 3);
    let (r1, r2, r3) = (request("q-1", 1), request("q-2", 2), request("q-3", 1));
    let (a, b, c) = tokio::join!(p.launch(&r1), p.launch(&r2), p.launch(&r3));
    for r in [a.unwrap(), b.unwrap(), c.unwrap()] {
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert!(!r.launched.is_empty());
    }
    assert_eq!(fake.with(|s| s.groups["asg-spot"].instances.len()), 4);
    // Queued in the process: ESS never had to refuse one.
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_group_busy_with_someone_elses_activity_is_waited_for_within_bounds() {
    let (fake, p) = setup(true, 50).await;
    // Two refusals (ScalingActivityInProgress), then accepted: within the 4 attempts.
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().busy_calls = 2);
    let r = p.launch(&request("busy-1", 1)).await.unwrap();
    assert_eq!(r.launched.len(), 1);
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 3);
    // Busy for longer than the bound: an error naming the code, after exactly 4 attempts.
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().busy_calls = 10);
    let e = p.launch(&request("busy-2", 1)).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("ScalingActivityInProgress") && text.contains("4 attempts"),
        "{text}"
    );
    assert_eq!(
        fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(),
        3 + 4
    );
    // Removals wait too.
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().busy_calls = 1);
    p.terminate(&r.launched[0].id).await.unwrap();
    assert_eq!(fake.with(|s| s.calls_of("RemoveInstances")).len(), 2);
    assert!(fake.with(|s| s.groups["asg-spot"].instances.is_empty()));
    assert_clean(&fake);
}

#[tokio::test]
async fn a_repeat_while_the_first_activity_runs_follows_it_instead_of_scaling_again() {
    let (fake, p) = setup(true, 50).await;
    fake.with(|s| s.activity_polls = 100);
    let mut quick = config_for(&fake);
    quick.pools.push(pool(true));
    quick.activity_poll_interval = Duration::from_millis(1);
    quick.activity_timeout = Duration::from_millis(20);
    let impatient = AlibabaProvider::new(quick, creds()).unwrap();
    // The first call gives up following (timeout) while the activity still runs.
    let first = impatient.launch(&request("slow-1", 2)).await.unwrap();
    assert_eq!(first.launched.len(), 2);
    // Another process repeats the launch id: it follows the running activity (up to its own
    // timeout), and asks ESS for nothing more.
    fake.with(|s| {
        for a in s.activities.values_mut() {
            a.polls_left = a.polls_left.min(3);
        }
    });
    let again = p.launch(&request("slow-1", 2)).await.unwrap();
    assert!(again.launched.is_empty(), "{again:?}");
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn validate_names_missing_groups_vswitches_and_types_by_policy_field() {
    let (fake, p) = setup(true, 50).await;
    assert_eq!(p.validate().await.unwrap(), Vec::<String>::new());
    fake.with(|s| {
        s.groups.remove("asg-od");
        s.groups.get_mut("asg-spot").unwrap().vswitches.pop();
        s.vswitch_zones
            .insert("vsw-0".into(), "cn-hangzhou-k".into());
        s.stock
            .get_mut(&(ZONES[1].to_string(), true))
            .unwrap()
            .retain(|(t, _)| t != T4);
    });
    let problems = p.validate().await.unwrap();
    let want = [
        "pool gpu: alibaba.onDemandScalingGroupId: scaling group asg-od not found in region cn-hangzhou",
        "pool gpu: alibaba.vSwitches.cn-hangzhou-j: vSwitch vsw-1 is not a vSwitch of scaling group asg-spot",
        "pool gpu: alibaba.vSwitches.cn-hangzhou-i: vSwitch vsw-0 is in zone cn-hangzhou-k",
        "pool gpu: instanceTypes: ecs.gn6i-c4g1.xlarge is not offered in zone cn-hangzhou-j (spot)",
    ];
    for w in want {
        assert!(
            problems.iter().any(|p| p.starts_with(w)),
            "missing {w:?} in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), want.len(), "{problems:#?}");
    let groups = fake.with(|s| s.calls_of("DescribeScalingGroups"));
    assert_eq!(groups[0]["ScalingGroupId.1"], "asg-spot");
    assert_eq!(groups[0]["ScalingGroupId.2"], "asg-od");
    assert_clean(&fake);
}

#[tokio::test]
async fn a_partly_fulfilled_spot_launch_is_completed_on_demand_once_even_when_repeated() {
    let (fake, p) = setup(true, 50).await;
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().stock_left = Some(1));
    let first = p.launch(&request("part-1", 3)).await.unwrap();
    let by_type = |ct| {
        first
            .launched
            .iter()
            .filter(|i| i.offering.capacity_type == ct)
            .count()
    };
    assert_eq!(
        (by_type(CapacityType::Spot), by_type(CapacityType::OnDemand)),
        (1, 2)
    );
    // The spot activity ended Warning: its offerings are marked short of stock.
    assert_eq!(first.failures.len(), 2, "{:?}", first.failures);
    assert!(first
        .failures
        .iter()
        .all(|(k, e)| k.capacity_type == CapacityType::Spot
            && e.metric_label() == "insufficient_capacity"));
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert_eq!(
        scale
            .iter()
            .map(|c| (c["ScalingGroupId"].as_str(), c["AdjustmentValue"].as_str()))
            .collect::<Vec<_>>(),
        [("asg-spot", "3"), ("asg-od", "2")]
    );
    // The repeat counts both groups' activities: nothing more.
    let again = p.launch(&request("part-1", 3)).await.unwrap();
    assert!(
        again.launched.is_empty() && again.failures.is_empty(),
        "{again:?}"
    );
    assert_eq!(fake.with(|s| s.calls_of("ScaleWithAdjustment")).len(), 2);
    assert_eq!(p.list("gpu").await.unwrap().len(), 3);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_compensating_group_reports_its_on_demand_instances_as_on_demand() {
    let fake = Fake::start(&[("asg-spot", &ZONES)]).await;
    // ESS compensated: the spot group's new instances are pay-as-you-go.
    fake.with(|s| s.groups.get_mut("asg-spot").unwrap().spot_strategy = "NoSpot".into());
    let mut config = config_for(&fake);
    let mut p = pool(false);
    p.compensate_with_on_demand = true;
    config.pools.push(p);
    config.activity_poll_interval = Duration::from_millis(1);
    let provider = AlibabaProvider::new(config, creds()).unwrap();
    let r = provider.launch(&request("comp-1", 2)).await.unwrap();
    assert_eq!(r.launched.len(), 2);
    assert!(r
        .launched
        .iter()
        .all(|i| i.offering.capacity_type == CapacityType::OnDemand));
    let listed = provider.list("gpu").await.unwrap();
    assert!(listed
        .iter()
        .all(|i| i.offering.capacity_type == CapacityType::OnDemand && i.launch_id == "comp-1"));
    assert_clean(&fake);
}

#[tokio::test]
async fn two_clusters_pointed_at_one_group_leave_each_others_instances_alone() {
    let fake = Fake::start(&[("asg-spot", &ZONES), ("asg-od", &ZONES)]).await;
    let a = provider_for(&fake, false, 50, Some("uid-a"));
    let b = provider_for(&fake, false, 50, Some("uid-b"));
    let mine = a.launch(&request("launch-a", 2)).await.unwrap().launched;
    assert_eq!(mine.len(), 2);
    // Tagged with A's identity, which the activity's metadata carries too.
    let tagged = fake.with(|s| s.calls_of("TagResources"));
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0]["Tag.1.Key"], "gpu-node-autoscaler.io/cluster-id");
    assert_eq!(tagged[0]["Tag.1.Value"], "uid-a");
    let scale = fake.with(|s| s.calls_of("ScaleWithAdjustment"));
    assert!(scale[0]["ActivityMetadata"].contains("uid-a"), "{scale:?}");
    // An instance of the group that no cluster launched (the group's own minimum).
    fake.with(|s| {
        let mut own = s.groups["asg-spot"].instances[0].clone();
        own.id = "i-bp1groupown".into();
        own.activity = String::new();
        own.tags.clear();
        s.groups.get_mut("asg-spot").unwrap().instances.push(own);
    });

    let ids = |l: Vec<gpu_node_autoscaler_provider::Instance>| {
        let mut v: Vec<String> = l.into_iter().map(|i| i.id).collect();
        v.sort();
        v
    };
    let mut a_sees: Vec<String> = mine.iter().map(|i| i.id.clone()).collect();
    a_sees.push("i-bp1groupown".into());
    a_sees.sort();
    assert_eq!(ids(a.list("gpu").await.unwrap()), a_sees);
    assert_eq!(ids(b.list("gpu").await.unwrap()), ["i-bp1groupown"]);

    // B may not remove A's instance, even by id; A may.
    let e = b.terminate(&mine[0].provider_id).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::InvalidRequest { message } if message.contains("uid-a")),
        "{e:?}"
    );
    assert!(fake.with(|s| s.calls_of("RemoveInstances")).is_empty());
    a.terminate(&mine[0].provider_id).await.unwrap();
    assert_eq!(fake.with(|s| s.calls_of("RemoveInstances")).len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn an_instance_without_this_clusters_identity_is_listed_but_not_removed() {
    let fake = Fake::start(&[("asg-spot", &ZONES), ("asg-od", &ZONES)]).await;
    let a = provider_for(&fake, false, 50, Some("uid-a"));
    let b = provider_for(&fake, false, 50, Some("uid-b"));
    let mine = a.launch(&request("launch-a", 2)).await.unwrap().launched;
    assert_eq!(mine.len(), 2);
    // One the group launched itself (or an earlier version did), and one of A's that its
    // tagging after the launch missed.
    fake.with(|s| {
        let g = s.groups.get_mut("asg-spot").unwrap();
        let mut own = g.instances[0].clone();
        own.id = "i-bp1groupown".into();
        own.activity = String::new();
        own.tags.clear();
        g.instances.push(own);
        let untagged = g.instances.iter_mut().find(|i| i.id == mine[1].id).unwrap();
        untagged.tags.clear();
    });
    let listed = a.list("gpu").await.unwrap();
    let own = listed
        .iter()
        .find(|i| i.id == "i-bp1groupown")
        .expect("still counted")
        .provider_id
        .clone();
    let removed = || fake.with(|s| s.calls_of("RemoveInstances").len());

    let e = a.terminate(&own).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::InvalidRequest { message }
            if message.contains("carries no gpu-node-autoscaler.io/cluster-id")),
        "{e:?}"
    );
    assert_eq!(removed(), 0);

    // Untagged, but its launch activity names A: A's, not B's.
    let e = b.terminate(&mine[1].provider_id).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::InvalidRequest { message } if message.contains("uid-a")),
        "{e:?}"
    );
    assert_eq!(removed(), 0);
    a.terminate(&mine[1].provider_id).await.unwrap();
    assert_eq!(removed(), 1);

    // Tagged by hand with A's identity, the group's own instance is handed over.
    fake.with(|s| {
        let g = s.groups.get_mut("asg-spot").unwrap();
        let i = g
            .instances
            .iter_mut()
            .find(|i| i.id == "i-bp1groupown")
            .unwrap();
        i.tags
            .insert("gpu-node-autoscaler.io/cluster-id".into(), "uid-a".into());
    });
    a.terminate(&own).await.unwrap();
    assert_eq!(removed(), 2);
    assert_clean(&fake);
}
