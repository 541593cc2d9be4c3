//! A local fake of the ESS, ECS and VPC RPC endpoints, of STS `AssumeRoleWithOIDC` and of the
//! ECS metadata service's RAM-role credentials. RPC requests: every signature is recomputed with
//! the secret of the request's AccessKeyId (the test key, or temporary keys the fake issued), the
//! common and required parameters are checked, and answers have the response and error shapes of
//! Alibaba Cloud's API documentation. Problems with requests are collected in `violations`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use gpu_node_autoscaler_alibaba::sign;
use serde_json::{json, Value};

pub const KEY_ID: &str = "LTAI-test-id";
pub const SECRET: &str = "test-secret";
pub const TOKEN: &str = "sts-test-token";
pub const REGION: &str = "cn-hangzhou";
pub const ROLE_ARN: &str = "acs:ram::1234567890:role/gpu-node-autoscaler";
pub const OIDC_PROVIDER_ARN: &str = "acs:ram::1234567890:oidc-provider/ack-rrsa-c1";
pub const OIDC_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.oidc-token-body.signature";
pub const ECS_ROLE: &str = "KubernetesWorkerRole-gpu";
pub const METADATA_TOKEN: &str = "md-session-token-1";

#[derive(Clone, Debug)]
pub struct FakeInstance {
    pub id: String,
    pub zone: String,
    pub activity: String,
    pub instance_type: String,
    pub spot_strategy: String,
    /// ECS tags (`TagResources`).
    pub tags: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default)]
pub struct FakeGroup {
    pub zones: Vec<String>,
    pub vswitches: Vec<String>,
    pub instances: Vec<FakeInstance>,
    /// Scale-outs of this group fail for want of stock.
    pub no_stock: bool,
    /// Scale-outs of this group create at most this many instances each, then end `Warning`
    /// for want of stock.
    pub stock_left: Option<u32>,
    /// This many more scale-out / removal calls are refused with `ScalingActivityInProgress`
    /// (an activity someone else started).
    pub busy_calls: u32,
    pub compensate_with_on_demand: bool,
    pub lifecycle_state: String,
    /// Instance types of the group's configuration: new instances take them in turn.
    pub instance_types: Vec<String>,
    /// `SpotStrategy` of the group's new instances (`NoSpot` for a group named `...od...`).
    pub spot_strategy: String,
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
    pub asked: String,
    pub start: String,
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub groups: BTreeMap<String, FakeGroup>,
    pub activities: BTreeMap<String, FakeActivity>,
    pub tokens: BTreeMap<(String, String), String>,
    /// Every accepted RPC call: (action, decoded parameters without the common ones).
    pub calls: Vec<(String, BTreeMap<String, String>)>,
    /// The AccessKeyId of every accepted RPC call (its SecurityToken was checked to be that
    /// key's).
    pub signed_by: Vec<String>,
    /// Action → how many more calls answer `Throttling.User`.
    pub throttle: BTreeMap<String, u32>,
    /// Problems with requests (bad signature, missing parameters): a test asserts none.
    pub violations: Vec<String>,
    pub nonces: BTreeSet<String>,
    pub next: u32,
    /// AccessKeyId → (secret, STS token) the fake accepts.
    pub keys: BTreeMap<String, (String, Option<String>)>,
    /// Lifetime of the temporary credentials STS and the metadata service hand out.
    pub temporary_ttl_secs: i64,
    /// (method, path, metadata token header) of every metadata request.
    pub metadata_requests: Vec<(String, String, Option<String>)>,
    /// The metadata service refuses requests without a session token.
    pub metadata_hardened_only: bool,
    /// The metadata service does not hand out session tokens (`PUT` → 404).
    pub metadata_no_tokens: bool,
    /// Decoded form bodies of the `AssumeRoleWithOIDC` calls.
    pub sts_calls: Vec<BTreeMap<String, String>>,
    /// zone → (spot?) → [(type, StatusCategory)]; what `DescribeAvailableResource` offers.
    pub stock: BTreeMap<(String, bool), Vec<(String, String)>>,
    /// vSwitch id → zone.
    pub vswitch_zones: BTreeMap<String, String>,
    /// Polls an activity stays `InProgress`.
    pub activity_polls: u32,
}

impl FakeState {
    pub fn calls_of(&self, action: &str) -> Vec<BTreeMap<String, String>> {
        self.calls
            .iter()
            .filter(|(a, _)| a == action)
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn issue(&mut self, prefix: &str) -> Value {
        self.next += 1;
        let n = self.next;
        let (id, secret, token) = (
            format!("{prefix}.key{n}"),
            format!("{prefix}-secret-{n}"),
            format!("{prefix}-token-{n}"),
        );
        self.keys
            .insert(id.clone(), (secret.clone(), Some(token.clone())));
        let exp = chrono::Utc::now() + chrono::Duration::seconds(self.temporary_ttl_secs);
        json!({
            "AccessKeyId": id,
            "AccessKeySecret": secret,
            "SecurityToken": token,
            "Expiration": exp.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        })
    }
}

pub struct Fake {
    pub url: String,
    pub state: Arc<Mutex<FakeState>>,
}

/// One HTTP request as the fake sees it.
pub struct Req {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_request(sock: &mut TcpStream) -> Option<Req> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match sock.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let method = first.next()?.to_string();
    let target = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match sock.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
    Some(Req {
        method,
        target,
        headers,
        body,
    })
}

impl Fake {
    /// Serves on a free loopback port from a thread of its own (plain blocking I/O, so that
    /// tests of any runtime, or none, can use it).
    pub async fn start(groups: &[(&str, &[&str])]) -> Fake {
        Fake::start_blocking(groups)
    }

    pub fn start_blocking(groups: &[(&str, &[&str])]) -> Fake {
        let mut st = FakeState {
            temporary_ttl_secs: 3600,
            activity_polls: 1,
            ..FakeState::default()
        };
        st.keys
            .insert(KEY_ID.into(), (SECRET.into(), Some(TOKEN.into())));
        for (id, zones) in groups {
            let vswitches: Vec<String> = zones
                .iter()
                .enumerate()
                .map(|(i, _)| format!("vsw-{i}"))
                .collect();
            for (z, v) in zones.iter().zip(&vswitches) {
                st.vswitch_zones.insert(v.clone(), z.to_string());
            }
            st.groups.insert(
                id.to_string(),
                FakeGroup {
                    zones: zones.iter().map(|z| z.to_string()).collect(),
                    vswitches,
                    lifecycle_state: "Active".into(),
                    instance_types: vec![
                        "ecs.gn7i-c8g1.2xlarge".into(),
                        "ecs.gn6i-c4g1.xlarge".into(),
                    ],
                    spot_strategy: if id.contains("od") {
                        "NoSpot".into()
                    } else {
                        "SpotAsPriceGo".into()
                    },
                    ..FakeGroup::default()
                },
            );
            for z in *zones {
                for spot in [true, false] {
                    st.stock.insert(
                        (z.to_string(), spot),
                        vec![
                            ("ecs.gn7i-c8g1.2xlarge".into(), "WithStock".into()),
                            ("ecs.gn6i-c4g1.xlarge".into(), "ClosedWithStock".into()),
                        ],
                    );
                }
            }
        }
        let state = Arc::new(Mutex::new(st));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = state.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(mut sock) = sock else {
                    return;
                };
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let Some(req) = read_request(&mut sock) else {
                        return;
                    };
                    let (status, body) = route(&shared, &req);
                    let reason = if status == 200 { "OK" } else { "Error" };
                    let resp = format!(
                        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json;charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes());
                    let _ = sock.shutdown(std::net::Shutdown::Both);
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

const ESS_ACTIONS: [&str; 5] = [
    "ScaleWithAdjustment",
    "DescribeScalingActivities",
    "DescribeScalingInstances",
    "RemoveInstances",
    "DescribeScalingGroups",
];

fn decode_pairs(st: &mut FakeState, text: &str) -> Result<BTreeMap<String, String>, (u16, String)> {
    let mut params = BTreeMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match (sign::percent_decode(k), sign::percent_decode(v)) {
            (Some(k), Some(v)) => {
                params.insert(k, v);
            }
            _ => {
                st.violations.push(format!("bad escape in {pair}"));
                return Err(error(400, "InvalidParameter", "bad escape"));
            }
        }
    }
    Ok(params)
}

fn route(shared: &Mutex<FakeState>, req: &Req) -> (u16, String) {
    let mut st = shared.lock().unwrap();
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    if path.starts_with("/latest/") {
        return metadata(&mut st, req, path);
    }
    let params = match decode_pairs(&mut st, query) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if params.get("Action").map(String::as_str) == Some("AssumeRoleWithOIDC") {
        return sts(&mut st, req, &params);
    }
    if req.method != "GET" {
        st.violations
            .push(format!("RPC call with method {}", req.method));
    }
    handle(&mut st, params)
}

/// The ECS metadata service: session tokens, the role name, the role's credentials.
fn metadata(st: &mut FakeState, req: &Req, path: &str) -> (u16, String) {
    let token = req
        .header("X-aliyun-ecs-metadata-token")
        .map(str::to_string);
    st.metadata_requests
        .push((req.method.clone(), path.to_string(), token.clone()));
    if path == "/latest/api/token" {
        if req.method != "PUT" {
            return (405, "method not allowed".into());
        }
        if st.metadata_no_tokens {
            return (404, "not found".into());
        }
        match req.header("X-aliyun-ecs-metadata-token-ttl-seconds") {
            Some(ttl) if ttl.parse::<u32>().is_ok_and(|t| (1..=21600).contains(&t)) => {
                return (200, METADATA_TOKEN.into())
            }
            _ => {
                st.violations
                    .push("metadata token without a valid TTL".into());
                return (400, "bad ttl".into());
            }
        }
    }
    if req.method != "GET" {
        return (405, "method not allowed".into());
    }
    match token.as_deref() {
        Some(METADATA_TOKEN) => {}
        Some(other) => {
            st.violations.push(format!("metadata token {other:?}"));
            return (401, "unauthorized".into());
        }
        None if st.metadata_hardened_only => return (403, "forbidden".into()),
        None => {}
    }
    const PREFIX: &str = "/latest/meta-data/ram/security-credentials/";
    match path.strip_prefix(PREFIX) {
        Some("") => (200, ECS_ROLE.to_string()),
        Some(role) if role == ECS_ROLE => {
            let mut v = st.issue("ECS");
            v["Code"] = json!("Success");
            v["LastUpdated"] = json!("2026-11-22T01:00:00Z");
            (200, v.to_string())
        }
        _ => (404, "not found".into()),
    }
}

/// STS `AssumeRoleWithOIDC`: anonymous, parameters in the form body.
fn sts(st: &mut FakeState, req: &Req, query: &BTreeMap<String, String>) -> (u16, String) {
    if req.method != "POST" {
        st.violations.push("AssumeRoleWithOIDC not POSTed".into());
    }
    if query.contains_key("OIDCToken") {
        st.violations.push("OIDC token in the URL".into());
    }
    for (k, want) in [("Version", "2015-04-01"), ("Format", "JSON")] {
        if query.get(k).map(String::as_str) != Some(want) {
            st.violations.push(format!("AssumeRoleWithOIDC: {k}"));
        }
    }
    let form = match decode_pairs(st, &req.body) {
        Ok(p) => p,
        Err(e) => return e,
    };
    st.sts_calls.push(form.clone());
    let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    if get("RoleSessionName").is_empty() {
        st.violations
            .push("AssumeRoleWithOIDC: no RoleSessionName".into());
    }
    if !get("DurationSeconds")
        .parse::<u32>()
        .is_ok_and(|d| (900..=43200).contains(&d))
    {
        st.violations
            .push("AssumeRoleWithOIDC: DurationSeconds".into());
    }
    if get("RoleArn") != ROLE_ARN || get("OIDCProviderArn") != OIDC_PROVIDER_ARN {
        return error(404, "EntityNotExist.Role", "The specified Role not exists.");
    }
    if get("OIDCToken") != OIDC_TOKEN {
        return error(
            400,
            "AuthenticationFail.OIDCToken.Invalid",
            "The OIDC token is invalid.",
        );
    }
    let creds = st.issue("STS");
    ok(json!({
        "Credentials": creds,
        "AssumedRoleUser": {"Arn": format!("{ROLE_ARN}/session"), "AssumedRoleId": "3001:session"},
        "OIDCTokenInfo": {"Subject": "system:serviceaccount:kube-system:gpu-node-autoscaler"},
    }))
}

/// `PageNumber` (default 1) and `PageSize` (default 10, at most 50) of a listing.
fn paging(st: &mut FakeState, own: &BTreeMap<String, String>) -> (usize, usize) {
    let get = |k: &str, default: usize| own.get(k).and_then(|p| p.parse().ok()).unwrap_or(default);
    let (page, size) = (get("PageNumber", 1).max(1), get("PageSize", 10));
    if size > 50 {
        st.violations.push(format!("PageSize {size}"));
    }
    (page, size)
}

fn handle(st: &mut FakeState, mut params: BTreeMap<String, String>) -> (u16, String) {
    let Some(signature) = params.remove("Signature") else {
        st.violations.push("no Signature".into());
        return error(
            400,
            "MissingSignature",
            "Signature is mandatory for this action.",
        );
    };
    let key_id = params.get("AccessKeyId").cloned().unwrap_or_default();
    let Some((secret, token)) = st.keys.get(&key_id).cloned() else {
        st.violations
            .push(format!("unknown AccessKeyId {key_id:?}"));
        return error(
            404,
            "InvalidAccessKeyId.NotFound",
            "Specified access key is not found.",
        );
    };
    let expected = sign::signature("GET", &params, &secret);
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
    let ess = ESS_ACTIONS.contains(&action.as_str());
    let version = if ess {
        "2014-08-28"
    } else if action == "DescribeVSwitches" {
        "2016-04-28"
    } else {
        "2014-05-26"
    };
    let ts_ok = params
        .get("Timestamp")
        .is_some_and(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%SZ").is_ok());
    for (k, want) in [
        ("SignatureMethod", Some("HMAC-SHA1")),
        ("SignatureVersion", Some("1.0")),
        ("Format", Some("JSON")),
        ("Version", Some(version)),
        ("RegionId", Some(REGION)),
        ("SignatureNonce", None),
    ] {
        let got = params.get(k).map(String::as_str);
        if got.is_none() || want.is_some_and(|w| got != Some(w)) {
            st.violations.push(format!(
                "{action}: common parameter {k} = {got:?}, want {want:?}"
            ));
        }
    }
    if params.get("SecurityToken") != token.as_ref() {
        st.violations.push(format!(
            "{action}: SecurityToken {:?} is not the one of {key_id}",
            params.get("SecurityToken")
        ));
        return error(
            400,
            "InvalidSecurityToken.MismatchWithAccessKey",
            "The security token you provided does not match the access key.",
        );
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
        "DescribeScalingGroups" => &["ScalingGroupId.1"],
        "DescribeInstanceTypes" => &[],
        "DescribeSpotPriceHistory" => &["InstanceType", "NetworkType"],
        "DescribeAvailableResource" => &["DestinationResource", "ZoneId", "SpotStrategy"],
        "DescribeVSwitches" => &["VSwitchId"],
        "DescribeInstances" => &["InstanceIds"],
        "TagResources" => &["ResourceType", "ResourceId.1", "Tag.1.Key"],
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
    st.signed_by.push(key_id.clone());
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
    if ess && action != "DescribeScalingGroups" && !st.groups.contains_key(&group_id) {
        return error(
            404,
            "InvalidScalingGroupId.NotFound",
            "The specified scaling group does not exist.",
        );
    }
    // ESS runs one scaling activity per group at a time.
    if matches!(action.as_str(), "ScaleWithAdjustment" | "RemoveInstances") {
        let in_progress = st
            .activities
            .values()
            .any(|a| a.group == group_id && a.polls_left > 0);
        let g = st.groups.get_mut(&group_id).unwrap();
        let external = g.busy_calls > 0;
        if external {
            g.busy_calls -= 1;
        }
        let replay = action == "ScaleWithAdjustment"
            && st
                .tokens
                .contains_key(&(group_id.clone(), own["ClientToken"].clone()));
        if (in_progress || external) && !replay {
            return error(
                400,
                "ScalingActivityInProgress",
                "You cannot delete a scaling group or launch a new scaling activity while there \
                 is a scaling activity in progress for the specified scaling group.",
            );
        }
    }
    match action.as_str() {
        "ScaleWithAdjustment" => {
            if own["AdjustmentType"] != "QuantityChangeInCapacity" {
                st.violations.push("AdjustmentType".into());
            }
            if own["ClientToken"].len() > 64 || !own["ClientToken"].is_ascii() {
                st.violations.push("ClientToken".into());
            }
            let token = (group_id.clone(), own["ClientToken"].clone());
            if let Some(id) = st.tokens.get(&token) {
                if st.activities[id].asked != own["AdjustmentValue"] {
                    return error(
                        400,
                        "IdempotentParameterMismatch",
                        "The request uses the same client token as a previous, but non-identical request.",
                    );
                }
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
                polls_left: st.activity_polls,
                created: 0,
                asked: own["AdjustmentValue"].clone(),
                start: chrono::Utc::now().format("%Y-%m-%dT%H:%MZ").to_string(),
            };
            if no_stock {
                act.status = "Failed".into();
                act.error_code = "OperationDenied.NoStock".into();
                act.error_message = "The requested resource is sold out in the specified zone; try other types of resources or other regions and zones.".into();
            } else {
                let made = st.groups[&group_id]
                    .stock_left
                    .map_or(count, |s| s.min(count));
                if made < count {
                    act.status = "Warning".into();
                    act.error_code = "OperationDenied.NoStock".into();
                    act.error_message = "The requested resource is sold out in the specified zone; try other types of resources or other regions and zones.".into();
                }
                if let Some(s) = st.groups.get_mut(&group_id).unwrap().stock_left.as_mut() {
                    *s -= made;
                }
                for k in 0..made {
                    st.next += 1;
                    let n = st.next;
                    let g = st.groups.get_mut(&group_id).unwrap();
                    let zone = g.zones[k as usize % g.zones.len()].clone();
                    let instance_type =
                        g.instance_types[g.instances.len() % g.instance_types.len()].clone();
                    let spot_strategy = g.spot_strategy.clone();
                    g.instances.push(FakeInstance {
                        id: format!("i-bp1fake{n:06}"),
                        zone,
                        activity: id.clone(),
                        instance_type,
                        spot_strategy,
                        tags: BTreeMap::new(),
                    });
                }
                act.created = made;
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
            let (page, size) = paging(st, &own);
            // Newest first.
            let ids: Vec<String> = st
                .activities
                .iter()
                .rev()
                .filter(|(id, a)| a.group == group_id && (wanted.is_empty() || wanted.contains(id)))
                .map(|(id, _)| id.clone())
                .collect();
            let total = ids.len();
            let mut items = Vec::new();
            for id in ids.into_iter().skip((page - 1) * size).take(size) {
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
                    "StartTime": a.start,
                    "Description": format!("Add \"{}\" ECS instance", a.asked),
                    "Cause": "A user requests to execute scaling rule",
                }));
            }
            ok(json!({
                "TotalCount": total,
                "PageNumber": page,
                "PageSize": size,
                "ScalingActivities": { "ScalingActivity": items },
            }))
        }
        "DescribeScalingInstances" => {
            let (page, size) = paging(st, &own);
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
        "DescribeScalingGroups" => {
            // Inactive or unknown groups are left out, without an error.
            let items: Vec<Value> = own
                .iter()
                .filter(|(k, _)| k.starts_with("ScalingGroupId."))
                .filter_map(|(_, id)| st.groups.get(id).map(|g| (id, g)))
                .map(|(id, g)| {
                    json!({
                        "ScalingGroupId": id,
                        "ScalingGroupName": format!("{id}-name"),
                        "RegionId": REGION,
                        "LifecycleState": g.lifecycle_state,
                        "MinSize": 0,
                        "MaxSize": 100,
                        "MultiAZPolicy": "COST_OPTIMIZED",
                        "CompensateWithOnDemand": g.compensate_with_on_demand,
                        "VSwitchIds": { "VSwitchId": g.vswitches },
                        "VpcId": "vpc-fake",
                        "TotalCapacity": g.instances.len(),
                    })
                })
                .collect();
            ok(json!({
                "TotalCount": items.len(),
                "PageNumber": 1,
                "PageSize": 50,
                "ScalingGroups": { "ScalingGroup": items },
            }))
        }
        "DescribeVSwitches" => {
            let id = own["VSwitchId"].clone();
            let items: Vec<Value> = st
                .vswitch_zones
                .get(&id)
                .map(|z| {
                    vec![json!({"VSwitchId": id, "ZoneId": z, "VpcId": "vpc-fake",
                                "Status": "Available", "CidrBlock": "172.16.0.0/24"})]
                })
                .unwrap_or_default();
            ok(json!({
                "TotalCount": items.len(),
                "PageNumber": 1,
                "PageSize": 50,
                "VSwitches": { "VSwitch": items },
            }))
        }
        "DescribeAvailableResource" => {
            if own["DestinationResource"] != "InstanceType" {
                st.violations.push("DestinationResource".into());
            }
            let zone = own["ZoneId"].clone();
            let spot = match own["SpotStrategy"].as_str() {
                "NoSpot" => false,
                "SpotAsPriceGo" | "SpotWithPriceLimit" => true,
                other => {
                    st.violations.push(format!("SpotStrategy {other}"));
                    false
                }
            };
            let Some(types) = st.stock.get(&(zone.clone(), spot)) else {
                return ok(json!({}));
            };
            let supported: Vec<Value> = types
                .iter()
                .map(|(t, cat)| {
                    json!({
                        "Value": t,
                        "Status": if cat == "WithoutStock" { "SoldOut" } else { "Available" },
                        "StatusCategory": cat,
                    })
                })
                .collect();
            ok(json!({
                "AvailableZones": { "AvailableZone": [{
                    "ZoneId": zone,
                    "RegionId": REGION,
                    "Status": "Available",
                    "StatusCategory": "WithStock",
                    "AvailableResources": { "AvailableResource": [{
                        "Type": "InstanceType",
                        "SupportedResources": { "SupportedResource": supported },
                    }]},
                }]}
            }))
        }
        "DescribeInstances" => {
            let Ok(ids) = serde_json::from_str::<Vec<String>>(&own["InstanceIds"]) else {
                st.violations.push("InstanceIds is not a JSON array".into());
                return error(
                    400,
                    "InvalidInstanceIds.Malformed",
                    "The specified parameter InstanceIds is not valid.",
                );
            };
            if ids.len() > 100 {
                st.violations.push(format!("{} InstanceIds", ids.len()));
            }
            let items: Vec<Value> = st
                .groups
                .values()
                .flat_map(|g| &g.instances)
                .filter(|i| ids.contains(&i.id))
                .map(|i| {
                    json!({
                        "InstanceId": i.id,
                        "InstanceType": i.instance_type,
                        "ZoneId": i.zone,
                        "RegionId": REGION,
                        "Status": "Running",
                        "InstanceChargeType": "PostPaid",
                        "SpotStrategy": i.spot_strategy,
                        "CreationTime": "2026-11-22T01:00Z",
                        "Tags": {"Tag": i.tags.iter()
                            .map(|(k, v)| json!({"TagKey": k, "TagValue": v}))
                            .collect::<Vec<_>>()},
                    })
                })
                .collect();
            ok(json!({
                "TotalCount": items.len(),
                "PageNumber": 1,
                "PageSize": 100,
                "Instances": { "Instance": items },
            }))
        }
        "TagResources" => {
            if own["ResourceType"] != "instance" {
                st.violations.push(format!(
                    "TagResources: ResourceType {}",
                    own["ResourceType"]
                ));
            }
            let indexed = |prefix: &str| -> Vec<String> {
                (1..)
                    .map_while(|i| own.get(&format!("{prefix}{i}")).cloned())
                    .collect()
            };
            let ids = indexed("ResourceId.");
            if ids.len() > 50 {
                st.violations
                    .push(format!("TagResources: {} ResourceIds", ids.len()));
            }
            let tags: Vec<(String, String)> = (1..)
                .map_while(|i| {
                    let k = own.get(&format!("Tag.{i}.Key"))?;
                    Some((
                        k.clone(),
                        own.get(&format!("Tag.{i}.Value"))
                            .cloned()
                            .unwrap_or_default(),
                    ))
                })
                .collect();
            for g in st.groups.values_mut() {
                for inst in g.instances.iter_mut().filter(|i| ids.contains(&i.id)) {
                    inst.tags.extend(tags.iter().cloned());
                }
            }
            ok(json!({}))
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
