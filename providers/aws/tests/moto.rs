//! The AWS provider against a real EC2 API emulator (`moto_server`, started per test), with a
//! fault-injecting proxy for what moto cannot produce. When moto is not installed these tests
//! fail (they never skip): `scripts/test.sh` installs the pinned version.

use gpu_node_autoscaler_test_support::moto as support;

use std::collections::BTreeMap;

use gpu_node_autoscaler_aws::{
    AwsProvider, TAG_CLUSTER, TAG_CLUSTER_ID, TAG_LAUNCH_ID, TAG_MANAGED_BY, TAG_POOL,
    TAG_RESERVATION_ID,
};
use gpu_node_autoscaler_provider::{
    CapacityType, CloudProvider, GpuInfo, GpuVendor, InstanceState, LaunchRequest, OfferingKey,
    ProviderError, Reservation, ReservationKind,
};
use support::proxy::FaultProxy;
use support::{config, describe, ec2, network, Moto, Network, CLUSTER, POOL};

use CapacityType::{OnDemand, Reserved, Spot};

fn offering(t: &str, zone: &str, ct: CapacityType) -> OfferingKey {
    OfferingKey {
        instance_type: t.into(),
        zone: zone.into(),
        capacity_type: ct,
    }
}

fn request(launch_id: &str, count: u32, offerings: &[OfferingKey]) -> LaunchRequest {
    LaunchRequest {
        launch_id: launch_id.into(),
        pool: POOL.into(),
        count,
        offerings: offerings.to_vec(),
        tags: BTreeMap::from([("team".to_string(), "ml".to_string())]),
        reservations: Vec::new(),
        atomic: false,
    }
}

/// moto, its network, and a provider talking to it directly.
async fn setup() -> (Moto, Network, AwsProvider) {
    let moto = Moto::start();
    let net = network(&ec2(&moto.url()).await).await;
    let provider = AwsProvider::new(config(&moto.url(), &net, CLUSTER))
        .await
        .unwrap();
    (moto, net, provider)
}

/// moto, its network, a fault proxy in front of it, and a provider talking to the proxy.
async fn setup_with_proxy() -> (Moto, Network, FaultProxy, AwsProvider) {
    let moto = Moto::start();
    let net = network(&ec2(&moto.url()).await).await;
    let proxy = FaultProxy::start(moto.addr).await;
    let provider = AwsProvider::new(config(&proxy.url(), &net, CLUSTER))
        .await
        .unwrap();
    (moto, net, proxy, provider)
}

#[tokio::test]
async fn catalog_reports_gpus_zones_and_prices() {
    let (_moto, _net, provider) = setup().await;
    let cat = provider.catalog().await.unwrap();

    let g5 = cat.instance_type("g5.xlarge").unwrap();
    assert_eq!((g5.vcpu, g5.memory_mib), (4, 16384));
    assert_eq!(
        g5.gpu,
        Some(GpuInfo {
            model: "A10G".into(),
            vendor: GpuVendor::Nvidia,
            count: 1,
            memory_mib: 22888,
        })
    );
    assert_eq!(g5.on_demand_price, Some(1.006));
    let p4d = cat.instance_type("p4d.24xlarge").unwrap();
    assert_eq!(p4d.vcpu, 96);
    assert_eq!(
        p4d.gpu,
        Some(GpuInfo {
            model: "A100".into(),
            vendor: GpuVendor::Nvidia,
            count: 8,
            memory_mib: 40960,
        })
    );

    // Two types × three zones × two capacity types, each offered by moto's us-east-1.
    assert_eq!(cat.offerings.len(), 12, "{:#?}", cat.offerings);
    assert!(
        cat.offerings.iter().all(|o| o.available),
        "{:#?}",
        cat.offerings
    );
    let price = |ct| {
        cat.offerings
            .iter()
            .find(|o| o.key == offering("g5.xlarge", "us-east-1b", ct))
            .unwrap()
            .price_per_hour
    };
    assert_eq!(price(OnDemand), 1.006);
    // moto's spot price history says 0.00001 for everything.
    assert!(price(Spot) > 0.0 && price(Spot) < 0.001, "{}", price(Spot));
}

#[tokio::test]
async fn catalog_names_every_type_without_an_on_demand_price() {
    let moto = Moto::start();
    let net = network(&ec2(&moto.url()).await).await;
    let mut c = config(&moto.url(), &net, CLUSTER);
    c.pools[0].instance_types.push("g6.xlarge".into());
    c.pools[0].on_demand_prices.remove("p4d.24xlarge");
    let provider = AwsProvider::new(c).await.unwrap();
    match provider.catalog().await {
        Err(ProviderError::InvalidRequest { message }) => {
            assert!(
                message.contains("g6.xlarge, p4d.24xlarge") && !message.contains("g5.xlarge"),
                "{message}"
            );
        }
        other => panic!("expected an error naming the types, got {other:?}"),
    }
}

#[tokio::test]
async fn catalog_rejects_an_instance_type_the_region_does_not_know() {
    let moto = Moto::start();
    let net = network(&ec2(&moto.url()).await).await;
    let mut c = config(&moto.url(), &net, CLUSTER);
    c.pools[0].instance_types.push("zz9.mega".into());
    c.pools[0].on_demand_prices.insert("zz9.mega".into(), 1.0);
    let provider = AwsProvider::new(c).await.unwrap();
    match provider.catalog().await {
        Err(ProviderError::InvalidRequest { message }) => {
            assert!(message.contains("zz9.mega"), "{message}")
        }
        other => panic!("expected an error naming zz9.mega, got {other:?}"),
    }
}

#[tokio::test]
async fn an_invalid_configuration_is_refused_with_every_problem() {
    let mut c = gpu_node_autoscaler_aws::AwsConfig::new("us-east-1", CLUSTER);
    c.pools.push(gpu_node_autoscaler_aws::AwsPool {
        name: POOL.into(),
        launch_template: gpu_node_autoscaler_aws::LaunchTemplateRef::new(""),
        subnets: BTreeMap::from([("us-east-1a".to_string(), "sn-1".to_string())]),
        instance_types: vec!["g5.xlarge".into()],
        on_demand_prices: BTreeMap::new(),
        on_demand_allocation: Default::default(),
        spot_allocation: Default::default(),
    });
    let e = AwsProvider::new(c).await.unwrap_err().to_string();
    assert!(
        e.contains("pool gpu: launch template must not be empty"),
        "{e}"
    );
    assert!(
        e.contains("subnet \"sn-1\" of zone us-east-1a is not a subnet id"),
        "{e}"
    );
}

#[tokio::test]
async fn create_fleet_launches_tagged_spot_instances_in_the_requested_zone() {
    let (moto, net, provider) = setup().await;
    let req = request(
        "launch-1",
        2,
        &[
            offering("g5.xlarge", "us-east-1b", Spot),
            offering("g5.xlarge", "us-east-1a", Spot),
        ],
    );
    let r = provider.launch(&req).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.launched.len(), 2);
    let client = ec2(&moto.url()).await;
    for i in &r.launched {
        assert_eq!(i.offering, offering("g5.xlarge", "us-east-1b", Spot));
        assert_eq!(i.provider_id, format!("aws:///us-east-1b/{}", i.id));
        assert_eq!((i.pool.as_str(), i.launch_id.as_str()), (POOL, "launch-1"));
        let v = describe(&client, &i.id).await;
        assert_eq!(v.subnet, net.subnets["us-east-1b"]);
        assert_eq!(v.zone, "us-east-1b");
        assert!(v.spot, "launched on-demand");
        assert_eq!(v.tags[TAG_CLUSTER], CLUSTER);
        assert_eq!(v.tags[TAG_POOL], POOL);
        assert_eq!(v.tags[TAG_LAUNCH_ID], "launch-1");
        assert_eq!(v.tags[TAG_MANAGED_BY], "gpu-node-autoscaler");
        assert_eq!(v.tags["team"], "ml");
    }

    let listed = provider.list(POOL).await.unwrap();
    let mut ids: Vec<_> = r.launched.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    assert_eq!(listed.iter().map(|i| i.id.clone()).collect::<Vec<_>>(), ids);
    for i in &listed {
        assert_eq!(i.offering, offering("g5.xlarge", "us-east-1b", Spot));
        assert!(matches!(
            i.state,
            InstanceState::Pending | InstanceState::Running
        ));
        assert_eq!(i.launch_id, "launch-1");
        assert!(i.launched_at_ms > 0);
    }
    assert!(provider.list("other-pool").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_repeated_launch_launches_nothing_new() {
    let (_moto, _net, provider) = setup().await;
    let offerings = [offering("g5.xlarge", "us-east-1a", OnDemand)];
    let first = provider
        .launch(&request("launch-r", 2, &offerings))
        .await
        .unwrap();
    assert_eq!(first.launched.len(), 2);
    let again = provider
        .launch(&request("launch-r", 2, &offerings))
        .await
        .unwrap();
    assert!(again.launched.is_empty(), "{:?}", again.launched);
    assert!(again.failures.is_empty());
    assert_eq!(provider.list(POOL).await.unwrap().len(), 2);
    // Asking for more under the same id launches only the difference.
    let more = provider
        .launch(&request("launch-r", 3, &offerings))
        .await
        .unwrap();
    assert_eq!(more.launched.len(), 1);
    assert_eq!(provider.list(POOL).await.unwrap().len(), 3);
}

#[tokio::test]
async fn terminate_and_list() {
    let (moto, _net, provider) = setup().await;
    let r = provider
        .launch(&request(
            "launch-t",
            2,
            &[offering("p4d.24xlarge", "us-east-1c", OnDemand)],
        ))
        .await
        .unwrap();
    assert_eq!(r.launched.len(), 2);
    let (a, b) = (&r.launched[0], &r.launched[1]);
    provider.terminate(&a.id).await.unwrap();
    // By provider id too.
    let listed = provider.list(POOL).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, b.id);
    assert_eq!(
        describe(&ec2(&moto.url()).await, &a.id).await.state,
        "terminated"
    );
    provider.terminate(&b.provider_id).await.unwrap();
    assert!(provider.list(POOL).await.unwrap().is_empty());

    // Already terminated, and never existed: both success.
    provider.terminate(&a.id).await.unwrap();
    provider.terminate("i-0123456789abcdef0").await.unwrap();
    assert!(matches!(
        provider.terminate("vol-123").await,
        Err(ProviderError::InvalidRequest { .. })
    ));
}

#[tokio::test]
async fn a_restarted_provider_finds_its_instances_by_tags() {
    let (moto, net, provider) = setup().await;
    let req = request("launch-x", 2, &[offering("g5.xlarge", "us-east-1a", Spot)]);
    let launched = provider.launch(&req).await.unwrap().launched;
    assert_eq!(launched.len(), 2);
    drop(provider);

    let restarted = AwsProvider::new(config(&moto.url(), &net, CLUSTER))
        .await
        .unwrap();
    let found = restarted.list(POOL).await.unwrap();
    assert_eq!(found.len(), 2);
    for i in &found {
        assert!(launched.iter().any(|l| l.id == i.id));
        assert_eq!(i.offering, offering("g5.xlarge", "us-east-1a", Spot));
        assert_eq!(i.launch_id, "launch-x");
    }
    // The same launch after the restart creates nothing twice.
    assert!(restarted.launch(&req).await.unwrap().launched.is_empty());
    // Another cluster's provider owns none of them.
    let other = AwsProvider::new(config(&moto.url(), &net, "other-cluster"))
        .await
        .unwrap();
    assert!(other.list(POOL).await.unwrap().is_empty());
}

#[tokio::test]
async fn insufficient_capacity_in_one_zone_fails_that_offering_and_falls_back() {
    let (_moto, net, proxy, provider) = setup_with_proxy().await;
    proxy.fail_subnet(&net.subnets["us-east-1b"], "InsufficientInstanceCapacity");
    let r = provider
        .launch(&request(
            "launch-ice",
            2,
            &[
                offering("g5.xlarge", "us-east-1b", Spot),
                offering("g5.xlarge", "us-east-1a", Spot),
            ],
        ))
        .await
        .unwrap();
    let ice = offering("g5.xlarge", "us-east-1b", Spot);
    assert_eq!(
        r.failures,
        vec![(
            ice.clone(),
            ProviderError::InsufficientCapacity { offering: ice }
        )]
    );
    assert_eq!(r.launched.len(), 2);
    assert!(r
        .launched
        .iter()
        .all(|i| i.offering == offering("g5.xlarge", "us-east-1a", Spot)));
}

/// A reservation of `available` g5.xlarge in `zone`, as the controller read it.
fn reservation(id: &str, kind: ReservationKind, zone: &str, available: u32) -> Reservation {
    Reservation {
        id: id.into(),
        kind,
        instance_type: "g5.xlarge".into(),
        zone: zone.into(),
        total: 4,
        available,
        start_ms: None,
        end_ms: None,
        tags: BTreeMap::new(),
        price_per_hour: None,
    }
}

const TARGET: &str =
    "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId";

#[tokio::test]
async fn a_reserved_launch_targets_its_reservations_by_id_a_capacity_block_as_such() {
    let (moto, net, proxy, provider) = setup_with_proxy().await;
    let reserved = offering("g5.xlarge", "us-east-1a", Reserved);
    let mut req = request("launch-cr", 3, std::slice::from_ref(&reserved));
    req.reservations = vec![
        reservation("cr-0odcr", ReservationKind::Default, "us-east-1a", 1),
        // Of another zone: not this offering's.
        reservation("cr-0other", ReservationKind::Default, "us-east-1b", 4),
        reservation("cr-0block", ReservationKind::CapacityBlock, "us-east-1a", 2),
    ];
    let r = provider.launch(&req).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let mut got: Vec<_> = r
        .launched
        .iter()
        .map(|i| {
            (
                i.offering.clone(),
                i.reservation_id.clone().unwrap_or_default(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (reserved.clone(), "cr-0block".to_string()),
            (reserved.clone(), "cr-0block".to_string()),
            (reserved.clone(), "cr-0odcr".to_string()),
        ]
    );
    // No fleet: one RunInstances per call into a reservation, each targeting it by id, from
    // the pool's launch template in the offering's subnet; the block's with market type
    // capacity-block. (moto launches MinCount instances, one a call.)
    assert_eq!(proxy.calls_of("CreateFleet"), 0);
    let calls = proxy.requests_of("RunInstances");
    let target: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|p| {
            (
                p[TARGET].as_str(),
                p.get("InstanceMarketOptions.MarketType")
                    .map_or("", String::as_str),
                p["MaxCount"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        target,
        [
            ("cr-0odcr", "", "1"),
            ("cr-0block", "capacity-block", "2"),
            ("cr-0block", "capacity-block", "1"),
        ]
    );
    let tokens: std::collections::BTreeSet<_> = calls.iter().map(|p| &p["ClientToken"]).collect();
    assert_eq!(tokens.len(), 3, "a token of its own per call");
    for p in &calls {
        assert_eq!(p["LaunchTemplate.LaunchTemplateName"], "gpu-nodes");
        assert_eq!(p["InstanceType"], "g5.xlarge");
        assert_eq!(p["SubnetId"], net.subnets["us-east-1a"]);
        assert_eq!(p["MinCount"], "1");
        assert!(p["ClientToken"].starts_with("gna-launch-cr-r"), "{p:?}");
    }
    // Tagged as every launch, and with the reservation.
    let client = ec2(&moto.url()).await;
    for i in &r.launched {
        let v = describe(&client, &i.id).await;
        assert_eq!(v.zone, "us-east-1a");
        assert_eq!(v.tags[TAG_CLUSTER], CLUSTER);
        assert_eq!(v.tags[TAG_POOL], POOL);
        assert_eq!(v.tags[TAG_LAUNCH_ID], "launch-cr");
        assert_eq!(v.tags[TAG_MANAGED_BY], "gpu-node-autoscaler");
        assert_eq!(v.tags["team"], "ml");
        assert_eq!(Some(&v.tags[TAG_RESERVATION_ID]), i.reservation_id.as_ref());
    }
    // Listed as reserved in its reservation (moto reports no CapacityReservationId: the tag
    // says which).
    let mut listed: Vec<_> = provider
        .list(POOL)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.offering, i.reservation_id.unwrap_or_default()))
        .collect();
    listed.sort();
    assert_eq!(listed, got);
    // Asked again under the same launch id: nothing more.
    let again = provider.launch(&req).await.unwrap();
    assert!(
        again.launched.is_empty() && again.failures.is_empty(),
        "{again:?}"
    );
    assert_eq!(proxy.requests_of("RunInstances").len(), 3);
}

#[tokio::test]
async fn a_throttled_launch_into_a_reservation_is_retried_under_the_same_client_token() {
    let (_moto, _net, proxy, provider) = setup_with_proxy().await;
    proxy.throttle("RunInstances", 2);
    let reserved = offering("g5.xlarge", "us-east-1a", Reserved);
    let mut req = request("launch-thr", 1, std::slice::from_ref(&reserved));
    req.reservations = vec![reservation(
        "cr-0block",
        ReservationKind::CapacityBlock,
        "us-east-1a",
        1,
    )];
    let r = provider.launch(&req).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.launched.len(), 1);
    assert_eq!(r.launched[0].reservation_id.as_deref(), Some("cr-0block"));
    // Two throttled attempts and the one that launched: one call, one token.
    let calls = proxy.requests_of("RunInstances");
    assert_eq!(calls.len(), 3);
    assert!(calls
        .iter()
        .all(|p| p["ClientToken"] == calls[0]["ClientToken"]
            && p[TARGET] == "cr-0block"
            && p["InstanceMarketOptions.MarketType"] == "capacity-block"));
    assert_eq!(provider.list(POOL).await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_exhausted_reservation_is_insufficient_capacity_for_its_offering_only() {
    let (_moto, _net, proxy, provider) = setup_with_proxy().await;
    proxy.fail_reservation("cr-0full", "ReservationCapacityExceeded");
    let reserved = offering("g5.xlarge", "us-east-1a", Reserved);
    let on_demand = offering("g5.xlarge", "us-east-1a", OnDemand);
    let mut req = request("launch-full", 3, &[reserved.clone(), on_demand.clone()]);
    req.reservations = vec![
        reservation("cr-0full", ReservationKind::Default, "us-east-1a", 2),
        reservation("cr-0room", ReservationKind::Default, "us-east-1a", 1),
    ];
    let r = provider.launch(&req).await.unwrap();
    // The full one refused, the next one of the offering used, the offering then short, and
    // the rest launched on-demand by the fleet.
    assert_eq!(
        r.failures,
        vec![(
            reserved.clone(),
            ProviderError::InsufficientCapacity {
                offering: reserved.clone()
            }
        )]
    );
    let mut got: Vec<_> = r
        .launched
        .iter()
        .map(|i| (i.offering.capacity_type, i.reservation_id.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (OnDemand, None),
            (OnDemand, None),
            (Reserved, Some("cr-0room".to_string())),
        ]
    );
    let targets: Vec<String> = proxy
        .requests_of("RunInstances")
        .iter()
        .map(|p| p[TARGET].clone())
        .collect();
    assert_eq!(targets, ["cr-0full", "cr-0room"]);
    assert_eq!(proxy.calls_of("CreateFleet"), 1);

    // A reserved offering the request names no reservation for has no capacity: nothing is
    // launched outside a reservation for it.
    let r = provider
        .launch(&request("launch-none", 1, std::slice::from_ref(&reserved)))
        .await
        .unwrap();
    assert!(r.launched.is_empty(), "{r:?}");
    assert_eq!(
        r.failures,
        vec![(
            reserved.clone(),
            ProviderError::InsufficientCapacity { offering: reserved }
        )]
    );
}

#[tokio::test]
async fn spot_shortfall_launches_the_rest_on_demand_in_request_order() {
    let (moto, net, proxy, provider) = setup_with_proxy().await;
    proxy.cap_spot(1);
    let r = provider
        .launch(&request(
            "launch-partial",
            3,
            &[
                offering("g5.xlarge", "us-east-1a", Spot),
                offering("g5.xlarge", "us-east-1c", OnDemand),
                offering("g5.xlarge", "us-east-1a", OnDemand),
            ],
        ))
        .await
        .unwrap();
    let spot_a = offering("g5.xlarge", "us-east-1a", Spot);
    assert_eq!(
        r.failures,
        vec![(
            spot_a.clone(),
            ProviderError::InsufficientCapacity {
                offering: spot_a.clone()
            }
        )]
    );
    let got: Vec<&OfferingKey> = r.launched.iter().map(|i| &i.offering).collect();
    let od_c = offering("g5.xlarge", "us-east-1c", OnDemand);
    assert_eq!(got, vec![&spot_a, &od_c, &od_c]);
    let client = ec2(&moto.url()).await;
    let mut spot = 0;
    for i in &r.launched {
        let v = describe(&client, &i.id).await;
        spot += usize::from(v.spot);
        if i.offering.capacity_type == OnDemand {
            assert_eq!(v.subnet, net.subnets["us-east-1c"]);
        }
    }
    assert_eq!(spot, 1);
    assert_eq!(proxy.calls_of("CreateFleet"), 2);

    // Spot only, and no spot at all: nothing launched, the offering reported, no error.
    proxy.cap_spot(0);
    let r = provider
        .launch(&request("launch-none", 1, std::slice::from_ref(&spot_a)))
        .await
        .unwrap();
    assert!(r.launched.is_empty());
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].1.metric_label(), "insufficient_capacity");
}

#[tokio::test]
async fn quota_and_unknown_fleet_errors_are_typed_with_the_aws_message() {
    let (_moto, net, proxy, provider) = setup_with_proxy().await;
    proxy.fail_subnet(&net.subnets["us-east-1a"], "VcpuLimitExceeded");
    proxy.fail_subnet(&net.subnets["us-east-1b"], "InvalidFleetConfiguration");
    let r = provider
        .launch(&request(
            "launch-q",
            1,
            &[
                offering("p4d.24xlarge", "us-east-1a", OnDemand),
                offering("p4d.24xlarge", "us-east-1b", OnDemand),
                offering("p4d.24xlarge", "us-east-1c", OnDemand),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(r.launched.len(), 1);
    assert_eq!(r.launched[0].offering.zone, "us-east-1c");
    assert_eq!(r.failures.len(), 2, "{:?}", r.failures);
    assert_eq!(r.failures[0].0.zone, "us-east-1a");
    assert_eq!(r.failures[0].1.metric_label(), "quota_exceeded");
    assert_eq!(r.failures[1].0.zone, "us-east-1b");
    match &r.failures[1].1 {
        ProviderError::Other { message } => assert!(
            message.contains("InvalidFleetConfiguration: Injected InvalidFleetConfiguration"),
            "{message}"
        ),
        e => panic!("expected Other, got {e:?}"),
    }
}

#[tokio::test]
async fn throttled_calls_are_retried_then_reported() {
    let (_moto, _net, proxy, provider) = setup_with_proxy().await;
    let offerings = [offering("g5.xlarge", "us-east-1a", OnDemand)];
    // Two throttled calls, then success: the provider retried by itself.
    proxy.throttle("CreateFleet", 2);
    let r = provider
        .launch(&request("launch-slow", 1, &offerings))
        .await
        .unwrap();
    assert_eq!(r.launched.len(), 1);
    assert_eq!(proxy.calls_of("CreateFleet"), 3);

    // Throttled every time: after 4 attempts the caller gets `Throttled`.
    proxy.throttle("CreateFleet", 100);
    match provider
        .launch(&request("launch-stuck", 1, &offerings))
        .await
    {
        Err(ProviderError::Throttled { retry_after }) => assert!(retry_after.is_some()),
        other => panic!("expected Throttled, got {other:?}"),
    }
    assert_eq!(proxy.calls_of("CreateFleet"), 3 + 4);

    // The same for reads.
    proxy.throttle("DescribeInstances", 100);
    assert!(matches!(
        provider.list(POOL).await,
        Err(ProviderError::Throttled { .. })
    ));
    assert_eq!(proxy.calls_of("DescribeInstances"), 2 + 4);
}

#[tokio::test]
async fn validate_reports_what_the_account_lacks_before_any_launch() {
    let moto = Moto::start();
    let client = support::ec2(&moto.url()).await;
    let net = support::network(&client).await;
    let good = support::config(&moto.url(), &net, support::CLUSTER);
    let p = AwsProvider::new(good.clone()).await.unwrap();
    assert_eq!(p.validate().await.unwrap(), Vec::<String>::new());

    let mut bad = good;
    let pool = &mut bad.pools[0];
    pool.instance_types.push("x9.gpu".into());
    pool.launch_template = gpu_node_autoscaler_aws::LaunchTemplateRef::new("no-such-template");
    let a = pool.subnets["us-east-1a"].clone();
    pool.subnets.insert("us-east-1b".into(), a);
    pool.subnets
        .insert("us-east-1c".into(), "subnet-0123456789abcdef0".into());
    let p = AwsProvider::new(bad).await.unwrap();
    let problems = p.validate().await.unwrap();
    let want = [
        "pool gpu: instanceTypes: x9.gpu is not offered in region us-east-1",
        "pool gpu: aws.subnets.us-east-1b: subnet ",
        "is in zone us-east-1a",
        "pool gpu: aws.subnets.us-east-1c: subnet subnet-0123456789abcdef0 not found",
        "pool gpu: aws.launchTemplate: launch template no-such-template not found",
    ];
    for w in want {
        assert!(
            problems.iter().any(|p| p.contains(w)),
            "{w:?} not in {problems:#?}"
        );
    }
}

#[tokio::test]
async fn another_cluster_of_the_same_name_is_neither_listed_nor_terminated() {
    let (moto, net, _) = setup().await;
    let with_identity = |id: &str| {
        let mut c = config(&moto.url(), &net, CLUSTER);
        c.cluster_id = Some(id.to_string());
        c
    };
    let ours = AwsProvider::new(with_identity("uid-ours")).await.unwrap();
    let theirs = AwsProvider::new(with_identity("uid-theirs")).await.unwrap();
    let r = theirs
        .launch(&request(
            "launch-theirs",
            1,
            &[offering("g5.xlarge", "us-east-1a", OnDemand)],
        ))
        .await
        .unwrap();
    let id = r.launched[0].id.clone();
    let tags = describe(&ec2(&moto.url()).await, &id).await.tags;
    assert_eq!(tags[TAG_CLUSTER_ID], "uid-theirs");
    assert!(ours.list(POOL).await.unwrap().is_empty(), "not ours");
    let refused = ours.terminate(&id).await;
    assert!(
        matches!(&refused, Err(ProviderError::InvalidRequest { message }) if message.contains("not this cluster's")),
        "{refused:?}"
    );
    assert_eq!(
        describe(&ec2(&moto.url()).await, &id).await.state,
        "running"
    );
    // Its own cluster lists and terminates it.
    assert_eq!(theirs.list(POOL).await.unwrap().len(), 1);
    theirs.terminate(&id).await.unwrap();
}

#[tokio::test]
async fn orphan_an_instance_with_our_name_but_no_identity_is_listed_unclaimed_and_never_terminated()
{
    let (moto, net, _) = setup().await;
    // Launched by a version before the identity (or another installation of the same name
    // that knows none): our name and pool tags, no identity tag.
    let legacy = AwsProvider::new(config(&moto.url(), &net, CLUSTER))
        .await
        .unwrap();
    let r = legacy
        .launch(&request(
            "launch-legacy",
            1,
            &[offering("g5.xlarge", "us-east-1a", OnDemand)],
        ))
        .await
        .unwrap();
    let stranger = r.launched[0].id.clone();
    let tags = describe(&ec2(&moto.url()).await, &stranger).await.tags;
    assert!(!tags.contains_key(TAG_CLUSTER_ID), "{tags:?}");
    let mut c = config(&moto.url(), &net, CLUSTER);
    c.cluster_id = Some("uid-ours".into());
    let ours = AwsProvider::new(c).await.unwrap();
    let r = ours
        .launch(&request(
            "launch-ours",
            1,
            &[offering("g5.xlarge", "us-east-1a", OnDemand)],
        ))
        .await
        .unwrap();
    let mine = r.launched[0].id.clone();
    assert!(!r.launched[0].unclaimed);
    // Listed, so that it is seen and reported, but marked unclaimed; ours is not.
    let listed = ours.list(POOL).await.unwrap();
    let flag = |id: &str| listed.iter().find(|i| i.id == id).map(|i| i.unclaimed);
    assert_eq!(flag(&stranger), Some(true), "{listed:?}");
    assert_eq!(flag(&mine), Some(false), "{listed:?}");
    // Never terminated.
    let refused = ours.terminate(&stranger).await;
    assert!(
        matches!(&refused, Err(ProviderError::InvalidRequest { message }) if message.contains("not this cluster's")),
        "{refused:?}"
    );
    assert_eq!(
        describe(&ec2(&moto.url()).await, &stranger).await.state,
        "running"
    );
    // Without an identity of its own, a process knows no stranger: nothing is unclaimed.
    assert!(legacy
        .list(POOL)
        .await
        .unwrap()
        .iter()
        .all(|i| !i.unclaimed));
}

// ---- pools backed by Auto Scaling groups ----

mod asg {
    use super::*;
    use gpu_node_autoscaler_aws::groups::{
        self, TEMPLATE_LABEL, TEMPLATE_RESOURCES, TEMPLATE_TAINT,
    };
    use gpu_node_autoscaler_aws::settings::TagMatch;
    use gpu_node_autoscaler_aws::AutoScalingGroups;
    use support::{autoscaling, create_group, group_config, group_state, GroupSpec};

    const A: &str = "us-east-1a";

    fn spec<'a>(name: &'a str, zones: &'a [&'a str], spot: bool, max: i32) -> GroupSpec<'a> {
        GroupSpec {
            name,
            zones,
            types: &["g5.xlarge"],
            spot,
            launch_template: "gpu-nodes",
            min: 0,
            max,
            desired: 0,
            tags: &[],
        }
    }

    fn named(names: &[&str]) -> AutoScalingGroups {
        AutoScalingGroups::Named(names.iter().map(|n| n.to_string()).collect())
    }

    #[tokio::test]
    async fn asg_discovery_by_cluster_autoscaler_tags_and_scale_from_zero_with_tag_templates() {
        let moto = Moto::start();
        let client = ec2(&moto.url()).await;
        let net = network(&client).await;
        support::typed_launch_template(&client, "gpu-g5", "g5.xlarge").await;
        let asg = autoscaling(&moto.url()).await;
        let label = format!("{TEMPLATE_LABEL}nvidia.com/gpu.product");
        let taint = format!("{TEMPLATE_TAINT}nvidia.com/gpu");
        let gpus = format!("{TEMPLATE_RESOURCES}nvidia.com/gpu");
        let ours = format!("k8s.io/cluster-autoscaler/{CLUSTER}");
        let tags = [
            ("k8s.io/cluster-autoscaler/enabled", "true"),
            (ours.as_str(), "owned"),
            (label.as_str(), "NVIDIA-A10G"),
            (taint.as_str(), "present:NoSchedule"),
            (gpus.as_str(), "1"),
        ];
        create_group(
            &asg,
            &net,
            &GroupSpec {
                types: &[],
                launch_template: "gpu-g5",
                max: 4,
                tags: &tags,
                ..spec("gpu-a10g", &[A], false, 4)
            },
        )
        .await;
        // Another cluster's group, and a group without the tags: not discovered.
        create_group(
            &asg,
            &net,
            &GroupSpec {
                tags: &[
                    ("k8s.io/cluster-autoscaler/enabled", "true"),
                    ("k8s.io/cluster-autoscaler/other-cluster", "owned"),
                ],
                ..spec("other-cluster-gpu", &[A], false, 4)
            },
        )
        .await;
        create_group(&asg, &net, &spec("untagged", &[A], false, 4)).await;

        let provider = AwsProvider::new(group_config(
            &moto.url(),
            CLUSTER,
            AutoScalingGroups::Discovered(Vec::new()),
            &["g5.xlarge"],
        ))
        .await
        .unwrap();
        let pool = provider.config().group_pools[0].clone();
        let found = provider.pool_groups(&pool).await.unwrap();
        assert_eq!(
            found.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
            ["gpu-a10g"]
        );
        let g = &found[0];
        assert_eq!(g.instance_types, ["g5.xlarge"], "from the launch template");
        assert_eq!(g.zones, [A]);
        assert_eq!(g.capacity_type, OnDemand);
        let t = groups::node_template(&g.tags);
        assert_eq!(t.labels["nvidia.com/gpu.product"], "NVIDIA-A10G");
        assert_eq!(
            t.taints,
            [(
                "nvidia.com/gpu".to_string(),
                "present".to_string(),
                "NoSchedule".to_string()
            )]
        );
        assert_eq!(t.resources["nvidia.com/gpu"], "1");
        // A tag list of our own finds the other cluster's group alone.
        let mut c = group_config(
            &moto.url(),
            CLUSTER,
            AutoScalingGroups::Discovered(vec![TagMatch::parse(
                "k8s.io/cluster-autoscaler/other-cluster=owned",
            )]),
            &["g5.xlarge"],
        );
        c.cluster = "x".into();
        let other = AwsProvider::new(c).await.unwrap();
        let p = other.config().group_pools[0].clone();
        let found = other.pool_groups(&p).await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "other-cluster-gpu");

        // Scale from zero: the empty group's offering is in the catalog, and a launch grows it.
        let cat = provider.catalog().await.unwrap();
        let o = offering("g5.xlarge", A, OnDemand);
        assert!(
            cat.offerings.iter().any(|x| x.key == o && x.available),
            "{:#?}",
            cat.offerings
        );
        assert!(
            !cat.offerings
                .iter()
                .any(|x| x.key.zone != A || x.key.capacity_type != OnDemand),
            "only what the group offers: {:#?}",
            cat.offerings
        );
        assert_eq!(
            cat.instance_type("g5.xlarge")
                .unwrap()
                .gpu
                .as_ref()
                .unwrap()
                .count,
            1
        );
        let r = provider
            .launch(&request("asg-from-zero", 2, std::slice::from_ref(&o)))
            .await
            .unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(r.launched.len(), 2);
        for i in &r.launched {
            assert_eq!(i.offering, o);
            assert_eq!(
                (i.pool.as_str(), i.launch_id.as_str()),
                (POOL, "asg-from-zero")
            );
            assert_eq!(i.provider_id, format!("aws:///{A}/{}", i.id));
        }
        let (desired, ids) = group_state(&asg, "gpu-a10g").await;
        assert_eq!(desired, 2);
        let mut launched: Vec<String> = r.launched.iter().map(|i| i.id.clone()).collect();
        launched.sort();
        assert_eq!(ids, launched);
        let listed = provider.list(POOL).await.unwrap();
        assert_eq!(
            listed.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
            launched
        );
        assert!(listed
            .iter()
            .all(|i| i.launched_at_ms > 0 && i.launch_id == "asg-from-zero"));
        // The other groups were not touched.
        assert_eq!(group_state(&asg, "untagged").await.0, 0);
        assert_eq!(group_state(&asg, "other-cluster-gpu").await.0, 0);
    }

    /// The offerings the planner launches for the pool from `policy` and `catalog`, with the
    /// label `team` each gets: `type/zone/capacity team`.
    fn planned(
        policy: &gpu_node_autoscaler_core::policy::Policy,
        catalog: &gpu_node_autoscaler_provider::Catalog,
    ) -> Vec<String> {
        use gpu_node_autoscaler_core::plan::templates::Templates;
        let t = Templates::new(policy, catalog);
        assert!(t.errors.is_empty(), "{:?}", t.errors);
        let mut out: Vec<String> = t
            .for_snapshot(
                &Default::default(),
                gpu_node_autoscaler_core::model::Time(0),
            )
            .iter()
            .flat_map(|t| {
                t.offerings.iter().map(|o| {
                    format!(
                        "{} {}",
                        o.key,
                        o.labels.get("team").map(String::as_str).unwrap_or("-")
                    )
                })
            })
            .collect();
        out.sort();
        out
    }

    /// Tags a group, as `aws autoscaling create-or-update-tags` does.
    async fn tag(asg: &aws_sdk_autoscaling::Client, group: &str, tags: &[(&str, &str)]) {
        let mut req = asg.create_or_update_tags();
        for (k, v) in tags {
            req = req.tags(
                aws_sdk_autoscaling::types::Tag::builder()
                    .resource_id(group)
                    .resource_type("auto-scaling-group")
                    .key(*k)
                    .value(*v)
                    .propagate_at_launch(true)
                    .build(),
            );
        }
        req.send().await.expect("CreateOrUpdateTags");
    }

    #[tokio::test]
    async fn asg_a_group_tagged_after_start_is_discovered_on_the_next_reread_and_scaled() {
        use gpu_node_autoscaler_core::cloud_groups::{reread, GroupChange, Groups};
        const B: &str = "us-east-1b";
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        let ours = format!("k8s.io/cluster-autoscaler/{CLUSTER}");
        let team = format!("{TEMPLATE_LABEL}team");
        let discovery = [
            ("k8s.io/cluster-autoscaler/enabled", "true"),
            (ours.as_str(), "owned"),
        ];
        let tags_a = [discovery[0], discovery[1], (team.as_str(), "one")];
        create_group(
            &asg,
            &net,
            &GroupSpec {
                tags: &tags_a,
                ..spec("gpu-a", &[A], false, 4)
            },
        )
        .await;
        // Not tagged for discovery yet.
        create_group(&asg, &net, &spec("gpu-b", &[B], false, 4)).await;
        create_group(
            &asg,
            &net,
            &GroupSpec {
                types: &["p4d.24xlarge"],
                ..spec("gpu-unpriced", &[B], false, 4)
            },
        )
        .await;

        // Built as from a policy whose pool lists no instance types: every type the catalog
        // prices (here g5.xlarge only).
        let mut config = group_config(
            &moto.url(),
            CLUSTER,
            AutoScalingGroups::Discovered(Vec::new()),
            &[],
        );
        config.group_pools[0].on_demand_prices = [("g5.xlarge".to_string(), 1.006)].into();
        let provider = AwsProvider::new(config).await.unwrap();
        let parsed = gpu_node_autoscaler_core::policy::parse_policy_with(
            &format!(
                "clusterName: {CLUSTER}\nregion: us-east-1\npools:\n  - name: {POOL}\n    \
                 provider: aws\n    maxNodes: 8\n    aws: {{autoScalingGroups: {{autoDiscovery: {{}}}}}}\n"
            ),
            "policy.yaml",
            &[&gpu_node_autoscaler_aws::settings::POLICY],
        )
        .unwrap();
        // What the controller does on a read: the groups' templates and the offerings.
        let read = || async {
            let mut c = provider.catalog().await.unwrap();
            for o in &mut c.offerings {
                o.available = true;
            }
            (provider.templates().await.unwrap(), c)
        };
        let (found, catalog) = read().await;
        let start = reread(
            &parsed,
            &Groups::default(),
            &found,
            &Default::default(),
            &catalog,
        );
        assert_eq!(
            planned(&start.policy, &start.catalog),
            ["g5.xlarge/us-east-1a/on-demand one"]
        );

        // After start: gpu-b and gpu-unpriced tagged for discovery, gpu-a's label changed.
        tag(
            &asg,
            "gpu-b",
            &[discovery[0], discovery[1], (team.as_str(), "b")],
        )
        .await;
        tag(&asg, "gpu-unpriced", &discovery).await;
        tag(&asg, "gpu-a", &[(team.as_str(), "two")]).await;
        let (found, fresh_catalog) = read().await;
        let next = reread(
            &parsed,
            &start.groups,
            &found,
            &start.catalog,
            &fresh_catalog,
        );
        let reported: Vec<String> = next.changes.iter().map(GroupChange::message).collect();
        assert!(
            next.changes.contains(&GroupChange::Added {
                pool: POOL.into(),
                group: "gpu-b".into()
            }) && next.changes.contains(&GroupChange::Changed {
                pool: POOL.into(),
                group: "gpu-a".into(),
                what: vec!["labels"]
            }) && next.changes.contains(&GroupChange::Unpriced {
                pool: POOL.into(),
                group: "gpu-unpriced".into(),
                instance_type: "p4d.24xlarge".into()
            }),
            "{reported:#?}"
        );
        assert_eq!(
            planned(&next.policy, &next.catalog),
            [
                "g5.xlarge/us-east-1a/on-demand two",
                "g5.xlarge/us-east-1b/on-demand b"
            ]
        );

        // Scaled: a launch for the new group's offering grows it.
        let o = offering("g5.xlarge", B, OnDemand);
        let r = provider
            .launch(&request("asg-reread", 1, std::slice::from_ref(&o)))
            .await
            .unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(r.launched.len(), 1);
        assert_eq!(group_state(&asg, "gpu-b").await.0, 1);
        assert_eq!(group_state(&asg, "gpu-a").await.0, 0);

        // gpu-a deleted: its template is kept and reported once; gpu-b's instance untouched.
        asg.delete_auto_scaling_group()
            .auto_scaling_group_name("gpu-a")
            .force_delete(true)
            .send()
            .await
            .expect("DeleteAutoScalingGroup");
        let (found, fresh_catalog) = read().await;
        let gone = reread(&parsed, &next.groups, &found, &next.catalog, &fresh_catalog);
        assert_eq!(
            gone.changes,
            [GroupChange::Gone {
                pool: POOL.into(),
                group: "gpu-a".into()
            }]
        );
        assert_eq!(
            planned(&gone.policy, &gone.catalog),
            planned(&next.policy, &next.catalog)
        );
        assert_eq!(
            group_state(&asg, "gpu-b").await,
            (1, vec![r.launched[0].id.clone()])
        );
        let (found, fresh_catalog) = read().await;
        let quiet = reread(&parsed, &gone.groups, &found, &gone.catalog, &fresh_catalog);
        assert!(quiet.changes.is_empty(), "{:?}", quiet.changes);
    }

    #[tokio::test]
    async fn asg_a_managed_node_group_template_takes_labels_and_taints_from_describe_nodegroup() {
        use aws_sdk_eks::types::{Taint, TaintEffect, VpcConfigRequest};
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(support::REGION))
            .endpoint_url(moto.url())
            .load()
            .await;
        let eks = aws_sdk_eks::Client::new(&sdk);
        let subnets: Vec<String> = net.subnets.values().cloned().collect();
        eks.create_cluster()
            .name(CLUSTER)
            .role_arn("arn:aws:iam::123456789012:role/eks")
            .resources_vpc_config(
                VpcConfigRequest::builder()
                    .set_subnet_ids(Some(subnets.clone()))
                    .build(),
            )
            .send()
            .await
            .expect("CreateCluster");
        eks.create_nodegroup()
            .cluster_name(CLUSTER)
            .nodegroup_name("gpu-managed")
            .node_role("arn:aws:iam::123456789012:role/node")
            .set_subnets(Some(subnets))
            .labels("team", "from-eks")
            .labels("nvidia.com/gpu.present", "true")
            .taints(
                Taint::builder()
                    .key("nvidia.com/gpu")
                    .value("eks")
                    .effect(TaintEffect::NoSchedule)
                    .build(),
            )
            .taints(
                Taint::builder()
                    .key("dedicated")
                    .value("gpu")
                    .effect(TaintEffect::NoExecute)
                    .build(),
            )
            .send()
            .await
            .expect("CreateNodegroup");
        // The group behind it, as EKS tags it, with template tags of its own: a label EKS
        // also gives, one it does not, and a taint of the same key and effect as EKS's.
        let label = format!("{TEMPLATE_LABEL}team");
        let zone_label = format!("{TEMPLATE_LABEL}rack");
        let taint = format!("{TEMPLATE_TAINT}nvidia.com/gpu");
        let tags = [
            (groups::EKS_CLUSTER_NAME, CLUSTER),
            (groups::EKS_NODEGROUP_NAME, "gpu-managed"),
            (label.as_str(), "from-tag"),
            (zone_label.as_str(), "r1"),
            (taint.as_str(), "tag:NoSchedule"),
        ];
        create_group(
            &asg,
            &net,
            &GroupSpec {
                tags: &tags,
                ..spec("eks-gpu-managed-1234", &[A], false, 4)
            },
        )
        .await;
        // A group whose node group EKS does not know: its tags alone.
        let stray = [
            (groups::EKS_CLUSTER_NAME, CLUSTER),
            (groups::EKS_NODEGROUP_NAME, "deleted"),
            (label.as_str(), "stray"),
        ];
        create_group(
            &asg,
            &net,
            &GroupSpec {
                tags: &stray,
                ..spec("eks-deleted-5678", &[A], false, 4)
            },
        )
        .await;
        let provider = AwsProvider::new(group_config(
            &moto.url(),
            CLUSTER,
            named(&["eks-gpu-managed-1234", "eks-deleted-5678"]),
            &["g5.xlarge"],
        ))
        .await
        .unwrap();
        let found = provider.templates().await.unwrap();
        let t = &found[POOL];
        assert_eq!(t.len(), 2, "{t:#?}");
        let managed = &t[0];
        assert_eq!(managed.group, "eks-gpu-managed-1234");
        let labels: Vec<(&str, &str)> = managed
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("nvidia.com/gpu.present", "true"),
                ("rack", "r1"),
                ("team", "from-eks"),
            ],
            "DescribeNodegroup's labels win over the tags per key"
        );
        let mut taints = managed.taints.clone();
        taints.sort();
        assert_eq!(
            taints,
            [
                ("dedicated".into(), "gpu".into(), "NoExecute".into()),
                ("nvidia.com/gpu".into(), "eks".into(), "NoSchedule".into()),
            ]
        );
        let stray = &t[1];
        assert_eq!(stray.labels["team"], "stray");
        assert!(stray.taints.is_empty());
        // `check-policy --provider aws` shows the group as it is planned, EKS's part merged in.
        let (lines, _) = provider.group_report().await.unwrap();
        let line = lines
            .iter()
            .find(|l| l.contains("eks-gpu-managed-1234"))
            .expect("the managed group is reported");
        assert!(line.contains("team=from-eks"), "{line}");
        assert!(line.contains("dedicated=gpu:NoExecute"), "{line}");
        assert!(
            line.contains(&format!("EKS managed node group {CLUSTER}/gpu-managed")),
            "{line}"
        );
    }

    #[tokio::test]
    async fn asg_a_launch_repeated_after_its_group_failed_asks_for_all_of_it_again() {
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(&asg, &net, &spec("gpu-od-a", &[A], false, 10)).await;
        let proxy = FaultProxy::start(moto.addr).await;
        proxy.fail_scaling("gpu-od-a", "Launching EC2 instance failed.");
        let mut config = group_config(&proxy.url(), CLUSTER, named(&["gpu-od-a"]), &["g5.xlarge"]);
        config.group_failure_hold = std::time::Duration::ZERO;
        let provider = AwsProvider::new(config.clone()).await.unwrap();
        let req = request("asg-again", 2, &[offering("g5.xlarge", A, OnDemand)]);
        let r = provider.launch(&req).await.unwrap();
        assert!(r.launched.is_empty(), "{r:?}");
        assert_eq!(r.failures.len(), 1, "{r:?}");
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 0);
        // The group can launch again; the failed activity is older than the next raise.
        proxy.heal_scaling("gpu-od-a");
        tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
        let r = provider.launch(&req).await.unwrap();
        assert!(r.failures.is_empty(), "{r:?}");
        assert_eq!(
            r.launched.len(),
            2,
            "the failed raise launched nothing: {r:?}"
        );
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 2);
        // Counted once it launched: a restarted provider repeating it launches nothing.
        let restarted = AwsProvider::new(config).await.unwrap();
        assert!(restarted.launch(&req).await.unwrap().launched.is_empty());
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 2);
    }

    #[tokio::test]
    async fn asg_launch_is_idempotent_by_launch_id_across_a_restart() {
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(&asg, &net, &spec("gpu-od-a", &[A], false, 10)).await;
        let config = group_config(&moto.url(), CLUSTER, named(&["gpu-od-a"]), &["g5.xlarge"]);
        let provider = AwsProvider::new(config.clone()).await.unwrap();
        let req = request("asg-once", 2, &[offering("g5.xlarge", A, OnDemand)]);
        assert_eq!(provider.launch(&req).await.unwrap().launched.len(), 2);
        assert_eq!(provider.launch(&req).await.unwrap().launched.len(), 0);
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 2);
        // A fresh provider reads the launch off the group's tag.
        let restarted = AwsProvider::new(config).await.unwrap();
        assert_eq!(restarted.launch(&req).await.unwrap().launched.len(), 0);
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 2);
    }

    #[tokio::test]
    async fn asg_spot_group_whose_activity_fails_falls_back_to_the_next_group() {
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(&asg, &net, &spec("gpu-spot-a", &[A], true, 10)).await;
        create_group(&asg, &net, &spec("gpu-od-a", &[A], false, 10)).await;
        let proxy = FaultProxy::start(moto.addr).await;
        proxy.fail_scaling(
            "gpu-spot-a",
            "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot \
             capacity available that matches your request. Launching EC2 instance failed.",
        );
        // Discovered by a tag list that matches nothing but a name-less check: use names, in
        // the order the user gives (spot first).
        let provider = AwsProvider::new(group_config(
            &proxy.url(),
            CLUSTER,
            named(&["gpu-spot-a", "gpu-od-a"]),
            &["g5.xlarge"],
        ))
        .await
        .unwrap();
        let pool = provider.config().group_pools[0].clone();
        let found = provider.pool_groups(&pool).await.unwrap();
        assert_eq!(
            found
                .iter()
                .map(|g| (g.name.as_str(), g.capacity_type))
                .collect::<Vec<_>>(),
            [("gpu-spot-a", Spot), ("gpu-od-a", OnDemand)]
        );
        let spot = offering("g5.xlarge", A, Spot);
        let od = offering("g5.xlarge", A, OnDemand);
        let r = provider
            .launch(&request("asg-fallback", 2, &[spot.clone(), od.clone()]))
            .await
            .unwrap();
        assert_eq!(r.launched.len(), 2, "{r:?}");
        assert!(r.launched.iter().all(|i| i.offering == od), "{r:?}");
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert_eq!(
            r.failures[0],
            (
                spot.clone(),
                ProviderError::InsufficientCapacity {
                    offering: spot.clone()
                }
            )
        );
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 2);
        // The spot group was asked for 2 once; its desired capacity is what it has (0).
        assert_eq!(proxy.desired_asked("gpu-spot-a").first(), Some(&2));
        assert_eq!(group_state(&asg, "gpu-spot-a").await, (0, Vec::new()));
        // While it is held short, the catalog says so and the next launch does not try it.
        let cat = provider.catalog().await.unwrap();
        let avail = |k: &OfferingKey| {
            cat.offerings
                .iter()
                .find(|o| o.key == *k)
                .unwrap()
                .available
        };
        assert!(!avail(&spot) && avail(&od));
        let asked = proxy.desired_asked("gpu-spot-a").len();
        let r = provider
            .launch(&request("asg-fallback-2", 1, &[spot.clone(), od.clone()]))
            .await
            .unwrap();
        assert_eq!(r.launched.len(), 1);
        assert_eq!(proxy.desired_asked("gpu-spot-a").len(), asked);
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 3);
    }

    #[tokio::test]
    async fn asg_launch_slower_than_the_group_wait_is_given_back_after_the_provision_time() {
        use std::time::Duration;
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(&asg, &net, &spec("gpu-od-a", &[A], false, 10)).await;
        let proxy = FaultProxy::start(moto.addr).await;
        // The group takes its desired capacity and launches nothing (yet), failing nothing.
        proxy.slow_scaling("gpu-od-a");
        let mut c = group_config(&proxy.url(), CLUSTER, named(&["gpu-od-a"]), &["g5.xlarge"]);
        c.group_launch_wait = Duration::from_millis(300);
        c.group_provision_time = Duration::from_secs(2);
        let provider = AwsProvider::new(c).await.unwrap();
        let od = offering("g5.xlarge", A, OnDemand);
        let r = provider
            .launch(&request("asg-slow", 2, std::slice::from_ref(&od)))
            .await
            .unwrap();
        // The wait ran out with nothing launched and nothing failed: the group stays raised.
        assert!(r.launched.is_empty() && r.failures.is_empty(), "{r:?}");
        assert_eq!(proxy.desired_asked("gpu-od-a"), [2]);
        // After the provisioning time, a look at the pool gives back the two that never came
        // (down to the instances the group has: none), and the offering is short.
        let mut looks = 0;
        while proxy.desired_asked("gpu-od-a").len() < 2 && looks < 600 {
            provider.list(POOL).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            looks += 1;
        }
        assert_eq!(proxy.desired_asked("gpu-od-a"), [2, 0]);
        let cat = provider.catalog().await.unwrap();
        let o = cat.offerings.iter().find(|o| o.key == od).unwrap();
        assert!(!o.available, "{o:?}");
        // Given back once: later looks lower nothing more.
        provider.list(POOL).await.unwrap();
        assert_eq!(proxy.desired_asked("gpu-od-a"), [2, 0]);
    }

    #[test]
    fn asg_give_back_of_an_unfulfilled_raise_lowers_only_what_never_came() {
        let inst = |id: &str, lifecycle: &str| groups::GroupInstance {
            id: id.into(),
            zone: A.into(),
            instance_type: "g5.xlarge".into(),
            lifecycle: lifecycle.into(),
            protected_from_scale_in: false,
        };
        let g = |min, desired, instances: Vec<groups::GroupInstance>| groups::Group {
            name: "g".into(),
            min,
            max: 10,
            desired,
            instance_types: vec!["g5.xlarge".into()],
            zones: vec![A.into()],
            capacity_type: OnDemand,
            tags: BTreeMap::new(),
            instances,
            source: String::new(),
        };
        // Raised 3 → 6, one came: the two that never came are given back.
        let four = (0..4)
            .map(|i| inst(&format!("i-{i}"), "InService"))
            .collect();
        assert_eq!(groups::give_back_unfulfilled(&g(0, 6, four), 2), Some(4));
        // Never below the instances it has (a pending one counts; a leaving one does not).
        let have = vec![
            inst("i-0", "InService"),
            inst("i-1", "Pending"),
            inst("i-2", "Terminating"),
        ];
        assert_eq!(groups::give_back_unfulfilled(&g(0, 3, have), 3), Some(2));
        // Nor below its minimum size; nothing to lower: none.
        assert_eq!(
            groups::give_back_unfulfilled(&g(2, 3, Vec::new()), 3),
            Some(2)
        );
        assert_eq!(groups::give_back_unfulfilled(&g(0, 2, Vec::new()), 0), None);
        assert_eq!(
            groups::give_back_unfulfilled(
                &g(0, 2, vec![inst("i-0", "InService"), inst("i-1", "Pending")]),
                2
            ),
            None
        );
    }

    #[tokio::test]
    async fn asg_gang_spans_two_groups_in_one_zone() {
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(&asg, &net, &spec("gpu-a-1", &[A], false, 2)).await;
        create_group(&asg, &net, &spec("gpu-a-2", &[A], false, 3)).await;
        create_group(&asg, &net, &spec("gpu-b", &["us-east-1b"], false, 10)).await;
        let provider = AwsProvider::new(group_config(
            &moto.url(),
            CLUSTER,
            named(&["gpu-a-1", "gpu-a-2", "gpu-b"]),
            &["g5.xlarge"],
        ))
        .await
        .unwrap();
        let r = provider
            .launch(&request(
                "asg-gang",
                4,
                &[offering("g5.xlarge", A, OnDemand)],
            ))
            .await
            .unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(r.launched.len(), 4);
        assert!(r.launched.iter().all(|i| i.offering.zone == A));
        assert_eq!(
            group_state(&asg, "gpu-a-1").await.0,
            2,
            "the first group to its max"
        );
        assert_eq!(
            group_state(&asg, "gpu-a-2").await.0,
            2,
            "the rest in the second"
        );
        assert_eq!(group_state(&asg, "gpu-b").await.0, 0, "no other zone");
        // More than the zone's groups hold: the rest is reported short, nothing over max.
        let r = provider
            .launch(&request(
                "asg-gang-2",
                3,
                &[offering("g5.xlarge", A, OnDemand)],
            ))
            .await
            .unwrap();
        assert_eq!(r.launched.len(), 1);
        assert!(matches!(
            r.failures.as_slice(),
            [(_, ProviderError::InsufficientCapacity { .. })]
        ));
        assert_eq!(group_state(&asg, "gpu-a-2").await.0, 3);
    }

    #[tokio::test]
    async fn asg_terminate_takes_the_instance_out_with_a_decrement_and_respects_min_size() {
        let moto = Moto::start();
        let client = ec2(&moto.url()).await;
        let net = network(&client).await;
        let asg = autoscaling(&moto.url()).await;
        create_group(
            &asg,
            &net,
            &GroupSpec {
                min: 1,
                desired: 3,
                ..spec("gpu-od-a", &[A], false, 4)
            },
        )
        .await;
        create_group(
            &asg,
            &net,
            &GroupSpec {
                desired: 1,
                ..spec("not-ours", &[A], false, 4)
            },
        )
        .await;
        let provider = AwsProvider::new(group_config(
            &moto.url(),
            CLUSTER,
            named(&["gpu-od-a"]),
            &["g5.xlarge"],
        ))
        .await
        .unwrap();
        let (_, ids) = group_state(&asg, "gpu-od-a").await;
        assert_eq!(ids.len(), 3);
        // Protected from scale-in: refused, nothing changes.
        asg.set_instance_protection()
            .auto_scaling_group_name("gpu-od-a")
            .instance_ids(&ids[2])
            .protected_from_scale_in(true)
            .send()
            .await
            .unwrap();
        let e = provider.terminate(&ids[2]).await.unwrap_err();
        assert!(e.to_string().contains("protected from scale-in"), "{e}");
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 3);
        // The exact instance goes, the desired capacity with it.
        provider
            .terminate(&format!("aws:///{A}/{}", ids[0]))
            .await
            .unwrap();
        let (desired, left) = group_state(&asg, "gpu-od-a").await;
        assert_eq!(desired, 2);
        assert!(!left.contains(&ids[0]), "{left:?}");
        assert_eq!(describe(&client, &ids[0]).await.state, "terminated");
        assert!(left.contains(&ids[1]) && left.contains(&ids[2]));
        // Again: already gone is fine.
        provider.terminate(&ids[0]).await.unwrap();
        // Down to the minimum size (1): the next is refused.
        provider.terminate(&ids[1]).await.unwrap();
        assert_eq!(group_state(&asg, "gpu-od-a").await.0, 1);
        asg.set_instance_protection()
            .auto_scaling_group_name("gpu-od-a")
            .instance_ids(&ids[2])
            .protected_from_scale_in(false)
            .send()
            .await
            .unwrap();
        let e = provider.terminate(&ids[2]).await.unwrap_err();
        assert!(e.to_string().contains("minimum size (1)"), "{e}");
        assert_eq!(
            group_state(&asg, "gpu-od-a").await,
            (1, vec![ids[2].clone()])
        );
        // An instance of a group no pool scales is never terminated.
        let (_, theirs) = group_state(&asg, "not-ours").await;
        let e = provider.terminate(&theirs[0]).await.unwrap_err();
        assert!(e.to_string().contains("which no pool scales"), "{e}");
        assert_eq!(describe(&client, &theirs[0]).await.state, "running");
        // Nor an instance outside every group that is not tagged as ours.
        let plain = client
            .run_instances()
            .image_id(
                client
                    .describe_images()
                    .owners("amazon")
                    .send()
                    .await
                    .unwrap()
                    .images()[0]
                    .image_id()
                    .unwrap(),
            )
            .min_count(1)
            .max_count(1)
            .send()
            .await
            .unwrap();
        let plain_id = plain.instances()[0].instance_id().unwrap().to_string();
        assert!(provider.terminate(&plain_id).await.is_err());
        assert_eq!(describe(&client, &plain_id).await.state, "running");
    }

    #[tokio::test]
    async fn asg_check_report_lists_each_group_and_what_the_pool_lacks() {
        let moto = Moto::start();
        let net = network(&ec2(&moto.url()).await).await;
        let asg = autoscaling(&moto.url()).await;
        let label = format!("{TEMPLATE_LABEL}team");
        let bad = format!("{TEMPLATE_TAINT}gpu");
        create_group(
            &asg,
            &net,
            &GroupSpec {
                tags: &[(label.as_str(), "ml"), (bad.as_str(), "oops")],
                ..spec("gpu-spot-a", &[A], true, 10)
            },
        )
        .await;
        let mut c = group_config(
            &moto.url(),
            CLUSTER,
            named(&["gpu-spot-a", "gpu-missing"]),
            &["g5.xlarge", "p4d.24xlarge"],
        );
        c.group_pools[0].zones = vec![A.into(), "us-east-1b".into()];
        c.group_pools[0].capacity_types = vec![Spot, OnDemand];
        let provider = AwsProvider::new(c).await.unwrap();
        let (found, problems) = provider.group_report().await.unwrap();
        assert_eq!(
            found,
            [format!(
                "pool gpu: group gpu-spot-a: MixedInstancesPolicy [g5.xlarge] in {A} (spot), \
                 size 0..10 (desired 0), labels team=ml"
            )]
        );
        let want = [
            "pool gpu: aws.autoScalingGroups.names: Auto Scaling group gpu-missing not found",
            "pool gpu: aws.autoScalingGroups: instance type p4d.24xlarge is launched by none of its groups",
            "pool gpu: aws.autoScalingGroups: zone us-east-1b has none of its groups",
            "pool gpu: aws.autoScalingGroups: capacity type on-demand is bought by none of its groups",
            "pool gpu: aws.autoScalingGroups: group gpu-spot-a: tag k8s.io/cluster-autoscaler/node-template/taint/gpu=oops: a taint is `value:Effect` (Effect one of NoSchedule, PreferNoSchedule, NoExecute)",
        ];
        assert_eq!(problems, want);
    }
}

#[tokio::test]
async fn latest_and_default_launch_template_versions_resolve_to_their_number_and_image() {
    let (moto, net, _) = setup().await;
    let client = ec2(&moto.url()).await;
    let mut c = config(&moto.url(), &net, CLUSTER);
    let mut latest = c.pools[0].clone();
    latest.name = "latest".into();
    latest.launch_template.version = "$Latest".into();
    let mut fixed = c.pools[0].clone();
    fixed.name = "fixed".into();
    fixed.launch_template.version = "1".into();
    c.pools.push(latest);
    c.pools.push(fixed);
    let provider = AwsProvider::new(c).await.unwrap();
    let versions = provider.launch_versions().await.unwrap();
    // A fixed version is what the policy says already: only the moving ones are asked.
    assert_eq!(
        versions.keys().map(String::as_str).collect::<Vec<_>>(),
        [POOL, "latest"]
    );
    let v1 = versions[POOL].clone();
    assert_eq!(versions["latest"], v1);
    assert!(
        v1.starts_with("lt-") && v1.contains(" version 1 (ami-"),
        "{v1}"
    );

    // A new version with another image: `$Latest` moves to it, `$Default` stays.
    let images = client
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .unwrap();
    let old_image = v1.split(" (").nth(1).unwrap().trim_end_matches(')');
    let new_image = images
        .images()
        .iter()
        .filter_map(|i| i.image_id())
        .find(|i| *i != old_image)
        .expect("moto ships several AMIs")
        .to_string();
    client
        .create_launch_template_version()
        .launch_template_name(&net.launch_template)
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id(&new_image)
                .build(),
        )
        .send()
        .await
        .expect("CreateLaunchTemplateVersion");
    let versions = provider.launch_versions().await.unwrap();
    assert_eq!(versions[POOL], v1);
    assert!(
        versions["latest"].ends_with(&format!(" version 2 ({new_image})")),
        "{versions:?}"
    );
    // It becomes the default: `$Default` moves too.
    client
        .modify_launch_template()
        .launch_template_name(&net.launch_template)
        .default_version("2")
        .send()
        .await
        .expect("ModifyLaunchTemplate");
    let versions = provider.launch_versions().await.unwrap();
    assert_eq!(versions[POOL], versions["latest"]);
}

#[tokio::test]
async fn a_launch_template_that_is_gone_is_an_error_of_launch_versions() {
    let moto = Moto::start();
    let net = network(&ec2(&moto.url()).await).await;
    let mut c = config(&moto.url(), &net, CLUSTER);
    c.pools[0].launch_template.id_or_name = "no-such-template".into();
    let provider = AwsProvider::new(c).await.unwrap();
    assert!(provider.launch_versions().await.is_err());
}

#[tokio::test]
async fn a_listed_instance_carries_the_launch_fingerprint_it_was_tagged_with() {
    let (_moto, _net, provider) = setup().await;
    let mut req = request(
        "launch-fp",
        1,
        &[offering("g5.xlarge", "us-east-1a", OnDemand)],
    );
    req.tags.insert(
        gpu_node_autoscaler_provider::LAUNCH_FINGERPRINT_TAG.into(),
        "provider=0a1b2c3d labels=00000000".into(),
    );
    let r = provider.launch(&req).await.unwrap();
    assert_eq!(r.launched.len(), 1, "{:?}", r.failures);
    assert_eq!(
        r.launched[0].launch_fingerprint.as_deref(),
        Some("provider=0a1b2c3d labels=00000000")
    );
    // A restarted controller lists it with what the launch used.
    let listed = provider.list(POOL).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].launch_fingerprint.as_deref(),
        Some("provider=0a1b2c3d labels=00000000")
    );
    // One launched without it has none.
    let r = provider
        .launch(&request(
            "launch-bare",
            1,
            &[offering("g5.xlarge", "us-east-1a", OnDemand)],
        ))
        .await
        .unwrap();
    let bare = provider
        .list(POOL)
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.id == r.launched[0].id)
        .unwrap();
    assert_eq!(bare.launch_fingerprint, None);
}

/// The nodes of a best-effort-atomic ProvisioningRequest (a gang, all or nothing in one zone)
/// are one instant fleet whose `MinTargetCapacity` is the count, with `SingleAvailabilityZone`
/// and `SingleInstanceType` as EC2 requires for it: the cloud itself launches all or none. A
/// launch that is not atomic sets none of them.
#[tokio::test]
async fn provisioning_request_gang_is_one_instant_fleet_with_min_target_capacity() {
    let (_moto, _net, proxy, provider) = setup_with_proxy().await;
    let offerings = [
        offering("g5.xlarge", "us-east-1a", OnDemand),
        offering("g5.xlarge", "us-east-1b", OnDemand),
    ];
    let mut req = request("launch-gang", 2, &offerings);
    req.atomic = true;
    let r = provider.launch(&req).await.unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.launched.len(), 2);
    let zones: std::collections::BTreeSet<_> =
        r.launched.iter().map(|i| i.offering.zone.clone()).collect();
    assert_eq!(zones.len(), 1, "{zones:?}");
    let calls = proxy.requests_of("CreateFleet");
    assert_eq!(calls.len(), 1);
    let p = &calls[0];
    assert_eq!(p["Type"], "instant");
    assert_eq!(p["OnDemandOptions.MinTargetCapacity"], "2", "{p:?}");
    assert_eq!(p["OnDemandOptions.SingleAvailabilityZone"], "true");
    assert_eq!(p["OnDemandOptions.SingleInstanceType"], "true");
    assert_eq!(p["TargetCapacitySpecification.TotalTargetCapacity"], "2");

    // Spot: the same on the spot options.
    let mut req = request(
        "launch-gang-spot",
        3,
        &[offering("g5.xlarge", "us-east-1a", Spot)],
    );
    req.atomic = true;
    provider.launch(&req).await.unwrap();
    let calls = proxy.requests_of("CreateFleet");
    let p = calls.last().unwrap();
    assert_eq!(p["SpotOptions.MinTargetCapacity"], "3", "{p:?}");
    assert_eq!(p["SpotOptions.SingleAvailabilityZone"], "true");
    assert_eq!(p["SpotOptions.SingleInstanceType"], "true");

    // Not atomic: none of them.
    provider
        .launch(&request("launch-plain", 2, &offerings))
        .await
        .unwrap();
    let calls = proxy.requests_of("CreateFleet");
    let p = calls.last().unwrap();
    assert!(
        p.keys().all(|k| !k.contains("MinTargetCapacity")
            && !k.contains("SingleAvailabilityZone")
            && !k.contains("SingleInstanceType")),
        "{p:?}"
    );
}
