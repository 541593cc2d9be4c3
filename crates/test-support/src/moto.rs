//! Test support: a `moto_server` EC2 and Auto Scaling emulator per test, network and group
//! set-up through the SDK, and a fault-injecting HTTP proxy between the provider and moto.

pub mod proxy;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::types::{RequestLaunchTemplateData, Tag};
use aws_sdk_ec2::Client;
use gpu_node_autoscaler_aws::{
    AwsConfig, AwsPool, LaunchTemplateRef, OnDemandAllocation, RetryPolicy, SpotAllocation,
};

/// The moto version `scripts/test.sh` installs.
pub const MOTO_VERSION: &str = "5.1.22";
pub const REGION: &str = "us-east-1";
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
pub const POOL: &str = "gpu";
pub const CLUSTER: &str = "test-cluster";

/// A running `moto_server`, killed when dropped.
pub struct Moto {
    child: Child,
    pub addr: SocketAddr,
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().unwrap().port()
}

impl Moto {
    /// Starts `python3 -m moto.server` (or `moto_server`) on a free loopback port and waits until
    /// it answers. Panics — the test fails, it is not skipped — when moto is not installed.
    pub fn start() -> Moto {
        set_test_credentials();
        // The port is free when picked and taken only when moto binds it: another test's server
        // may take it in between. Then moto exits ("address already in use") and starts again on
        // another port; a port that answers but not as moto does (another server) is not taken
        // for moto's.
        for _ in 0..3 {
            if let Some(moto) = Moto::start_on(free_port()) {
                return moto;
            }
        }
        panic!("moto_server found no free port in 3 tries (each taken by another server first)");
    }

    /// Starts moto on `port`; `None` when the port turned out to be another server's.
    fn start_on(port: u16) -> Option<Moto> {
        let log = std::env::temp_dir().join(format!("moto-{port}.log"));
        let args = ["-H", "127.0.0.1", "-p", &port.to_string()];
        let spawn = |program: &str, pre: &[&str]| {
            let stderr = std::fs::File::create(&log).expect("create moto log");
            Command::new(program)
                .args(pre)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
        };
        let installed = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let child = if installed {
            spawn("python3", &["-m", "moto.server"])
        } else {
            spawn("moto_server", &[])
        }
        .unwrap_or_else(|e| {
            panic!(
                "cannot start moto_server ({e}): install it with \
                 `python3 -m pip install 'moto[server]=={MOTO_VERSION}'` (scripts/test.sh does)"
            )
        });
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut moto = Moto { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("in use") {
                    return None;
                }
                panic!("moto_server exited ({status}) before answering:\n{text}");
            }
            if answers_as_moto(&addr) {
                return Some(moto);
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer on {addr} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the server on `addr` is moto: its own API (`/moto-api/data.json`) answers 200.
fn answers_as_moto(addr: &SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /moto-api/data.json HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// moto accepts any credentials; the provider finds these through the default chain.
pub fn set_test_credentials() {
    std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    std::env::set_var("AWS_SESSION_TOKEN", "testing");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    std::env::remove_var("AWS_PROFILE");
}

/// A plain EC2 client for set-up and for checking what the provider did.
pub async fn ec2(url: &str) -> Client {
    set_test_credentials();
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(url)
        .load()
        .await;
    Client::new(&sdk)
}

/// A VPC with one subnet per zone of [`ZONES`] and a launch template `gpu-nodes`.
pub struct Network {
    pub subnets: BTreeMap<String, String>,
    pub launch_template: String,
}

pub async fn network(client: &Client) -> Network {
    let vpc = client
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await
        .expect("CreateVpc");
    let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).unwrap().to_string();
    let mut subnets = BTreeMap::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let s = client
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(format!("10.0.{i}.0/24"))
            .availability_zone(*zone)
            .send()
            .await
            .expect("CreateSubnet");
        let id = s.subnet().and_then(|s| s.subnet_id()).unwrap().to_string();
        subnets.insert(zone.to_string(), id);
    }
    let images = client
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("DescribeImages");
    let ami = images
        .images()
        .iter()
        .find_map(|i| i.image_id())
        .expect("moto ships AMIs")
        .to_string();
    client
        .create_launch_template()
        .launch_template_name("gpu-nodes")
        .launch_template_data(RequestLaunchTemplateData::builder().image_id(ami).build())
        .send()
        .await
        .expect("CreateLaunchTemplate");
    Network {
        subnets,
        launch_template: "gpu-nodes".to_string(),
    }
}

/// The provider configuration for `network`, talking to `url`, with fast retries.
pub fn config(url: &str, net: &Network, cluster: &str) -> AwsConfig {
    let mut c = AwsConfig::new(REGION, cluster);
    c.endpoint_url = Some(url.to_string());
    c.retry = RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
    };
    c.pools.push(AwsPool {
        name: POOL.to_string(),
        launch_template: LaunchTemplateRef::new(&net.launch_template),
        subnets: net.subnets.clone(),
        instance_types: vec!["g5.xlarge".into(), "p4d.24xlarge".into()],
        on_demand_prices: [
            ("g5.xlarge".to_string(), 1.006),
            ("p4d.24xlarge".to_string(), 32.77),
        ]
        .into_iter()
        .collect(),
        on_demand_allocation: OnDemandAllocation::Prioritized,
        spot_allocation: SpotAllocation::PriceCapacityOptimized,
    });
    c
}

/// What EC2 itself says about an instance: (subnet, zone, lifecycle, tags).
pub struct Ec2View {
    pub subnet: String,
    pub zone: String,
    pub spot: bool,
    pub state: String,
    pub tags: BTreeMap<String, String>,
}

pub async fn describe(client: &Client, id: &str) -> Ec2View {
    let r = client
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances");
    let i = &r.reservations()[0].instances()[0];
    Ec2View {
        subnet: i.subnet_id().unwrap_or_default().to_string(),
        zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        spot: i.instance_lifecycle().is_some_and(|l| l.as_str() == "spot"),
        state: i
            .state()
            .and_then(|s| s.name())
            .map(|n| n.as_str().to_string())
            .unwrap_or_default(),
        tags: i
            .tags()
            .iter()
            .map(|t: &Tag| {
                (
                    t.key().unwrap_or_default().to_string(),
                    t.value().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    }
}

/// A plain Auto Scaling client for set-up and for checking what the provider did.
pub async fn autoscaling(url: &str) -> aws_sdk_autoscaling::Client {
    set_test_credentials();
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(url)
        .load()
        .await;
    aws_sdk_autoscaling::Client::new(&sdk)
}

/// A launch template `name` whose instances are `instance_type` (for groups that take their
/// type from their template).
pub async fn typed_launch_template(client: &Client, name: &str, instance_type: &str) {
    let images = client
        .describe_images()
        .owners("amazon")
        .send()
        .await
        .expect("DescribeImages");
    let ami = images
        .images()
        .iter()
        .find_map(|i| i.image_id())
        .expect("moto ships AMIs")
        .to_string();
    client
        .create_launch_template()
        .launch_template_name(name)
        .launch_template_data(
            RequestLaunchTemplateData::builder()
                .image_id(ami)
                .instance_type(aws_sdk_ec2::types::InstanceType::from(instance_type))
                .build(),
        )
        .send()
        .await
        .expect("CreateLaunchTemplate");
}

/// An Auto Scaling group to create in moto.
pub struct GroupSpec<'a> {
    pub name: &'a str,
    /// Its zones: it gets the network's subnet of each.
    pub zones: &'a [&'a str],
    /// With types: a `MixedInstancesPolicy` with these overrides (all spot when `spot`); without:
    /// the launch template's own type.
    pub types: &'a [&'a str],
    pub spot: bool,
    pub launch_template: &'a str,
    pub min: i32,
    pub max: i32,
    pub desired: i32,
    pub tags: &'a [(&'a str, &'a str)],
}

/// Creates the group in moto.
pub async fn create_group(client: &aws_sdk_autoscaling::Client, net: &Network, g: &GroupSpec<'_>) {
    use aws_sdk_autoscaling::types::{
        InstancesDistribution, LaunchTemplate, LaunchTemplateOverrides,
        LaunchTemplateSpecification, MixedInstancesPolicy, Tag as AsgTag,
    };
    let lt = LaunchTemplateSpecification::builder()
        .launch_template_name(g.launch_template)
        .version("$Default")
        .build();
    let subnets: Vec<&str> = g.zones.iter().map(|z| net.subnets[*z].as_str()).collect();
    let mut req = client
        .create_auto_scaling_group()
        .auto_scaling_group_name(g.name)
        .min_size(g.min)
        .max_size(g.max)
        .desired_capacity(g.desired)
        .vpc_zone_identifier(subnets.join(","));
    if g.types.is_empty() {
        req = req.launch_template(lt);
    } else {
        let mut template = LaunchTemplate::builder().launch_template_specification(lt);
        for t in g.types {
            template =
                template.overrides(LaunchTemplateOverrides::builder().instance_type(*t).build());
        }
        let mut policy = MixedInstancesPolicy::builder().launch_template(template.build());
        if g.spot {
            policy = policy.instances_distribution(
                InstancesDistribution::builder()
                    .on_demand_base_capacity(0)
                    .on_demand_percentage_above_base_capacity(0)
                    .build(),
            );
        }
        req = req.mixed_instances_policy(policy.build());
    }
    for (k, v) in g.tags {
        req = req.tags(
            AsgTag::builder()
                .resource_id(g.name)
                .resource_type("auto-scaling-group")
                .key(*k)
                .value(*v)
                .propagate_at_launch(true)
                .build(),
        );
    }
    req.send().await.expect("CreateAutoScalingGroup");
}

/// What Auto Scaling says of a group: (desired capacity, instance ids).
pub async fn group_state(client: &aws_sdk_autoscaling::Client, name: &str) -> (i32, Vec<String>) {
    let r = client
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(name)
        .send()
        .await
        .expect("DescribeAutoScalingGroups");
    let g = &r.auto_scaling_groups()[0];
    let mut ids: Vec<String> = g
        .instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect();
    ids.sort();
    (g.desired_capacity().unwrap_or(0), ids)
}

/// A provider configuration with one pool backed by Auto Scaling groups, talking to `url`,
/// with fast retries and short waits.
pub fn group_config(
    url: &str,
    cluster: &str,
    groups: gpu_node_autoscaler_aws::AutoScalingGroups,
    types: &[&str],
) -> AwsConfig {
    let mut c = config(
        url,
        &Network {
            subnets: BTreeMap::new(),
            launch_template: String::new(),
        },
        cluster,
    );
    c.pools.clear();
    c.group_launch_wait = Duration::from_secs(10);
    c.group_poll = Duration::from_millis(50);
    c.group_pools.push(gpu_node_autoscaler_aws::AsgPool {
        name: POOL.to_string(),
        groups,
        instance_types: types.iter().map(|t| t.to_string()).collect(),
        on_demand_prices: [
            ("g5.xlarge".to_string(), 1.006),
            ("p4d.24xlarge".to_string(), 32.77),
        ]
        .into_iter()
        .filter(|(t, _)| types.contains(&t.as_str()))
        .collect(),
        zones: ZONES.iter().map(|z| z.to_string()).collect(),
        capacity_types: Vec::new(),
    });
    c
}
