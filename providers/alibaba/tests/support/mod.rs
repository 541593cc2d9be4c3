//! A local fake of the ESS and ECS RPC endpoints: checks every request's signature (recomputed
//! with the test secret) and required parameters, keeps scaling-group state, and answers with the
//! response and error shapes of Alibaba Cloud's API documentation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use gpu_node_autoscaler_alibaba::sign;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const KEY_ID: &str = "LTAI-test-id";
pub const SECRET: &str = "test-secret";
pub const TOKEN: &str = "sts-test-token";

#[derive(Clone, Debug)]
pub struct FakeInstance {
    pub id: String,
    pub zone: String,
    pub activity: String,
}

#[derive(Clone, Debug, Default)]
pub struct FakeGroup {
    pub zones: Vec<String>,
    pub instances: Vec<FakeInstance>,
    /// Scale-outs of this group fail for want of stock.
    pub no_stock: bool,
}

#[derive(Clone, Debug)]
pub struct FakeActivity {
    pub group: String,
    pub status: String,
    pub metadata: String,
    pub error_code: String,
    pub error_message: String,
    /// `DescribeScalingActivities` answers `InProgress` this many more times.
    pub polls_left: u32,
    pub created: u32,
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub groups: BTreeMap<String, FakeGroup>,
    pub activities: BTreeMap<String, FakeActivity>,
    pub tokens: BTreeMap<(String, String), String>,
    /// Every accepted call: (action, decoded parameters without the common ones).
    pub calls: Vec<(String, BTreeMap<String, String>)>,
    /// Action → how many more calls answer `Throttling.User`.
    pub throttle: BTreeMap<String, u32>,
    /// Problems with requests (bad signature, missing parameters): a test asserts none.
    pub violations: Vec<String>,
    pub nonces: BTreeSet<String>,
    pub next: u32,
}

impl FakeState {
    pub fn calls_of(&self, action: &str) -> Vec<BTreeMap<String, String>> {
        self.calls
            .iter()
            .filter(|(a, _)| a == action)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

pub struct Fake {
    pub url: String,
    pub state: Arc<Mutex<FakeState>>,
}

impl Fake {
    pub async fn start(groups: &[(&str, &[&str])]) -> Fake {
        let mut st = FakeState::default();
        for (id, zones) in groups {
            st.groups.insert(
                id.to_string(),
                FakeGroup {
                    zones: zones.iter().map(|z| z.to_string()).collect(),
                    ..FakeGroup::default()
                },
            );
        }
        let state = Arc::new(Mutex::new(st));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (status, body) = handle(&shared, &target);
                    let reason = if status == 200 { "OK" } else { "Error" };
                    let resp = format!(
                        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json;charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Fake { url, state }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }
}

fn error(status: u16, code: &str, message: &str) -> (u16, String) {
    let body = json!({
        "RequestId": "6EF60BEC-0242-43AF-BB20-270359FB54A7",
        "HostId": "ess.aliyuncs.com",
        "Code": code,
        "Message": message,
        "Recommend": "https://api.aliyun.com/troubleshoot?q=".to_string() + code,
    });
    (status, body.to_string())
}

fn ok(mut v: Value) -> (u16, String) {
    v["RequestId"] = json!("473469C7-AA6F-4DC5-B3DB-A3DC0DE3C83E");
    (200, v.to_string())
}

const COMMON: [&str; 10] = [
    "Action",
    "Version",
    "Format",
    "RegionId",
    "AccessKeyId",
    "SignatureMethod",
    "SignatureVersion",
    "SignatureNonce",
    "Timestamp",
    "SecurityToken",
];

fn handle(shared: &Mutex<FakeState>, target: &str) -> (u16, String) {
    let mut st = shared.lock().unwrap();
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
    let mut params: BTreeMap<String, String> = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match (sign::percent_decode(k), sign::percent_decode(v)) {
            (Some(k), Some(v)) => {
                params.insert(k, v);
            }
            _ => {
                st.violations.push(format!("bad escape in {pair}"));
                return error(400, "InvalidParameter", "bad escape");
            }
        }
    }
    let Some(signature) = params.remove("Signature") else {
        st.violations.push("no Signature".into());
        return error(
            400,
            "MissingSignature",
            "Signature is mandatory for this action.",
        );
    };
    let expected = sign::signature("GET", &params, SECRET);
    if signature != expected {
        st.violations
            .push(format!("signature {signature} != {expected}"));
        return error(
            400,
            "SignatureDoesNotMatch",
            "Specified signature is not matched with our calculation.",
        );
    }
    let action = params.get("Action").cloned().unwrap_or_default();
    let ess = [
        "ScaleWithAdjustment",
        "DescribeScalingActivities",
        "DescribeScalingInstances",
        "RemoveInstances",
    ]
    .contains(&action.as_str());
    let version = if ess { "2014-08-28" } else { "2014-05-26" };
    let ts_ok = params
        .get("Timestamp")
        .is_some_and(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%SZ").is_ok());
    for (k, want) in [
        ("AccessKeyId", Some(KEY_ID)),
        ("SignatureMethod", Some("HMAC-SHA1")),
        ("SignatureVersion", Some("1.0")),
        ("Format", Some("JSON")),
        ("Version", Some(version)),
        ("RegionId", Some("cn-hangzhou")),
        ("SecurityToken", Some(TOKEN)),
        ("SignatureNonce", None),
    ] {
        let got = params.get(k).map(String::as_str);
        if got.is_none() || want.is_some_and(|w| got != Some(w)) {
            st.violations.push(format!(
                "{action}: common parameter {k} = {got:?}, want {want:?}"
            ));
        }
    }
    if !ts_ok {
        st.violations.push(format!("{action}: bad Timestamp"));
    }
    let nonce = params.get("SignatureNonce").cloned().unwrap_or_default();
    if !st.nonces.insert(nonce) {
        st.violations
            .push(format!("{action}: SignatureNonce reused"));
        return error(
            400,
            "SignatureNonceUsed",
            "Specified signature nonce was used already.",
        );
    }
    let required: &[&str] = match action.as_str() {
        "ScaleWithAdjustment" => &[
            "ScalingGroupId",
            "AdjustmentType",
            "AdjustmentValue",
            "ClientToken",
        ],
        "DescribeScalingActivities" | "DescribeScalingInstances" => &["ScalingGroupId"],
        "RemoveInstances" => &["ScalingGroupId", "InstanceIds.1"],
        "DescribeInstanceTypes" => &[],
        "DescribeSpotPriceHistory" => &["InstanceType", "NetworkType"],
        _ => {
            st.violations.push(format!("unknown action {action:?}"));
            return error(404, "InvalidAction.NotFound", "Specified api is not found.");
        }
    };
    for r in required {
        if !params.contains_key(*r) {
            st.violations.push(format!("{action}: missing {r}"));
            return error(400, &format!("MissingParameter.{r}"), "missing parameter");
        }
    }
    let own: BTreeMap<String, String> = params
        .iter()
        .filter(|(k, _)| !COMMON.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    st.calls.push((action.clone(), own.clone()));
    if let Some(n) = st.throttle.get_mut(&action) {
        if *n > 0 {
            *n -= 1;
            return error(
                400,
                "Throttling.User",
                "Request was denied due to user flow control.",
            );
        }
    }
    let group_id = own.get("ScalingGroupId").cloned().unwrap_or_default();
    if ess && !st.groups.contains_key(&group_id) {
        return error(
            404,
            "InvalidScalingGroupId.NotFound",
            "The specified scaling group does not exist.",
        );
    }
    match action.as_str() {
        "ScaleWithAdjustment" => {
            if own["AdjustmentType"] != "QuantityChangeInCapacity" {
                st.violations.push("AdjustmentType".into());
            }
            let token = (group_id.clone(), own["ClientToken"].clone());
            if let Some(id) = st.tokens.get(&token) {
                return ok(json!({ "ScalingActivityId": id }));
            }
            let count: u32 = own["AdjustmentValue"].parse().unwrap_or(0);
            st.next += 1;
            let id = format!("asa-fake{:04}", st.next);
            let no_stock = st.groups[&group_id].no_stock;
            let mut act = FakeActivity {
                group: group_id.clone(),
                status: "Successful".into(),
                metadata: own.get("ActivityMetadata").cloned().unwrap_or_default(),
                error_code: String::new(),
                error_message: String::new(),
                polls_left: 1,
                created: 0,
            };
            if no_stock {
                act.status = "Failed".into();
                act.error_code = "OperationDenied.NoStock".into();
                act.error_message = "The requested resource is sold out in the specified zone; try other types of resources or other regions and zones.".into();
            } else {
                for k in 0..count {
                    st.next += 1;
                    let n = st.next;
                    let g = st.groups.get_mut(&group_id).unwrap();
                    let zone = g.zones[k as usize % g.zones.len()].clone();
                    g.instances.push(FakeInstance {
                        id: format!("i-bp1fake{n:06}"),
                        zone,
                        activity: id.clone(),
                    });
                }
                act.created = count;
            }
            st.activities.insert(id.clone(), act);
            st.tokens.insert(token, id.clone());
            ok(json!({ "ScalingActivityId": id }))
        }
        "DescribeScalingActivities" => {
            let wanted: BTreeSet<&String> = own
                .iter()
                .filter(|(k, _)| k.starts_with("ScalingActivityId."))
                .map(|(_, v)| v)
                .collect();
            let ids: Vec<String> = st
                .activities
                .iter()
                .filter(|(id, a)| a.group == group_id && (wanted.is_empty() || wanted.contains(id)))
                .map(|(id, _)| id.clone())
                .collect();
            let mut items = Vec::new();
            for id in ids {
                let a = st.activities.get_mut(&id).unwrap();
                let status = if a.polls_left > 0 {
                    a.polls_left -= 1;
                    "InProgress".to_string()
                } else {
                    a.status.clone()
                };
                items.push(json!({
                    "ScalingActivityId": id,
                    "ScalingGroupId": a.group,
                    "StatusCode": status,
                    "StatusMessage": if a.error_message.is_empty() { "\"\"".to_string() } else { format!("Fail to create Instance: {}", a.error_message) },
                    "ErrorCode": a.error_code,
                    "ErrorMessage": a.error_message,
                    "Progress": if status == "InProgress" { 50 } else { 100 },
                    "TotalCapacity": a.created.to_string(),
                    "CreatedCapacity": a.created,
                    "ActivityMetadata": a.metadata,
                    "StartTime": "2026-11-22T01:00Z",
                    "Description": "Add \"1\" ECS instance",
                    "Cause": "A user requests to execute scaling rule",
                }));
            }
            ok(json!({
                "TotalCount": items.len(),
                "PageNumber": 1,
                "PageSize": 50,
                "ScalingActivities": { "ScalingActivity": items },
            }))
        }
        "DescribeScalingInstances" => {
            let page: usize = own
                .get("PageNumber")
                .and_then(|p| p.parse().ok())
                .unwrap_or(1);
            let size: usize = own
                .get("PageSize")
                .and_then(|p| p.parse().ok())
                .unwrap_or(10);
            if size > 50 {
                st.violations.push(format!("PageSize {size}"));
            }
            let ids: BTreeSet<&String> = own
                .iter()
                .filter(|(k, _)| k.starts_with("InstanceIds."))
                .map(|(_, v)| v)
                .collect();
            let all: Vec<&FakeInstance> = st.groups[&group_id]
                .instances
                .iter()
                .filter(|i| {
                    own.get("ScalingActivityId")
                        .is_none_or(|a| *a == i.activity)
                })
                .filter(|i| ids.is_empty() || ids.contains(&i.id))
                .collect();
            let items: Vec<Value> = all
                .iter()
                .skip((page - 1) * size)
                .take(size)
                .map(|i| {
                    json!({
                        "InstanceId": i.id,
                        "ScalingGroupId": group_id,
                        "ScalingConfigurationId": "asc-fake",
                        "HealthStatus": "Healthy",
                        "LifecycleState": "InService",
                        "CreationTime": "2026-11-22T01:00Z",
                        "CreationType": "AutoCreated",
                        "ZoneId": i.zone,
                        "ScalingActivityId": i.activity,
                        "WarmupState": "NoNeedWarmup",
                        "Weight": 1,
                    })
                })
                .collect();
            ok(json!({
                "TotalCount": all.len(),
                "PageNumber": page,
                "PageSize": size,
                "ScalingInstances": { "ScalingInstance": items },
            }))
        }
        "RemoveInstances" => {
            let id = own["InstanceIds.1"].clone();
            let g = st.groups.get_mut(&group_id).unwrap();
            let before = g.instances.len();
            g.instances.retain(|i| i.id != id);
            if g.instances.len() == before {
                return error(
                    400,
                    "InvalidInstanceId.NotFound",
                    "The specified instance does not exist in the scaling group.",
                );
            }
            st.next += 1;
            ok(json!({ "ScalingActivityId": format!("asa-fake{:04}", st.next) }))
        }
        "DescribeInstanceTypes" => {
            let all = [
                json!({"InstanceTypeId": "ecs.gn7i-c8g1.2xlarge", "InstanceTypeFamily": "ecs.gn7i",
                       "CpuCoreCount": 8, "MemorySize": 30.0, "GPUAmount": 1, "GPUSpec": "NVIDIA A10",
                       "GPUMemorySize": 24.0}),
                json!({"InstanceTypeId": "ecs.gn6i-c4g1.xlarge", "InstanceTypeFamily": "ecs.gn6i",
                       "CpuCoreCount": 4, "MemorySize": 15.0, "GPUAmount": 1, "GPUSpec": "NVIDIA T4",
                       "GPUMemorySize": 16.0}),
                json!({"InstanceTypeId": "ecs.g7.large", "CpuCoreCount": 2, "MemorySize": 8.0,
                       "GPUAmount": 0, "GPUSpec": ""}),
            ];
            let wanted: BTreeSet<&String> = own
                .iter()
                .filter(|(k, _)| k.starts_with("InstanceTypes."))
                .map(|(_, v)| v)
                .collect();
            let items: Vec<&Value> = all
                .iter()
                .filter(|t| wanted.is_empty() || wanted.iter().any(|w| t["InstanceTypeId"] == ***w))
                .collect();
            ok(json!({ "InstanceTypes": { "InstanceType": items }, "NextToken": "" }))
        }
        "DescribeSpotPriceHistory" => {
            let t = own["InstanceType"].clone();
            let items: Vec<Value> = if t == "ecs.gn7i-c8g1.2xlarge" {
                vec![
                    json!({"ZoneId": "cn-hangzhou-i", "InstanceType": t, "IoOptimized": "optimized",
                           "NetworkType": "vpc", "Timestamp": "2026-11-22T00:00:00Z", "SpotPrice": 0.9, "OriginPrice": 2.0}),
                    json!({"ZoneId": "cn-hangzhou-i", "InstanceType": t, "IoOptimized": "optimized",
                           "NetworkType": "vpc", "Timestamp": "2026-11-22T01:00:00Z", "SpotPrice": 0.5, "OriginPrice": 2.0}),
                ]
            } else {
                Vec::new()
            };
            ok(
                json!({ "SpotPrices": { "SpotPriceType": items }, "NextOffset": 0, "Currency": "USD" }),
            )
        }
        _ => unreachable!(),
    }
}
