//! A fault-injecting HTTP/1.1 relay between the SDK and moto, for what moto cannot produce:
//! throttling (`RequestLimitExceeded`), an API failing (`InternalError`), errors for one subnet's
//! offerings (insufficient capacity, quotas, ...), partial fulfilment of spot fleets, and spot
//! prices that change (moto answers `DescribeSpotPriceHistory` with one fixed price), and the
//! account's capacity reservations (moto implements no capacity reservation call: the relay
//! answers `DescribeCapacityReservations` itself, in EC2's documented shape, from what the test
//! set with [`FaultProxy::set_capacity_reservations`]). It rewrites `CreateFleet` requests and
//! responses into the shapes EC2 documents, and the prices of `DescribeSpotPriceHistory`
//! responses. For Auto Scaling, whose scaling activities moto never fails (its
//! `DescribeScalingActivities` always answers none), it fails the launches of chosen groups:
//! their `SetDesiredCapacity` is answered without reaching moto (no instance is launched, the
//! desired capacity stays) and a `Failed` activity is recorded, which
//! `DescribeScalingActivities` for the group answers; and it makes chosen groups slow (their
//! `SetDesiredCapacity` answered without reaching moto, their desired capacity in
//! `DescribeAutoScalingGroups` answers as asked, no instance coming: a launch still under way). moto keeps no capacity reservations, so it
//! never refuses a `RunInstances` into one: the relay fails those that target a chosen
//! reservation ([`FaultProxy::fail_reservation`]). It records every request's parameters
//! ([`FaultProxy::requests_of`]), so that tests see what the SDK sent that moto ignores (a
//! targeted reservation). Everything else passes through unchanged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default, Debug)]
struct Faults {
    /// Action → how many more calls get a 503 `RequestLimitExceeded`.
    throttle: BTreeMap<String, u32>,
    /// Action → how many more calls get a 500 `InternalError`.
    fail: BTreeMap<String, u32>,
    /// (instance type, zone) → the spot price `DescribeSpotPriceHistory` answers.
    spot_prices: BTreeMap<(String, String), String>,
    /// Subnet → error code for every `CreateFleet` override in it.
    fail_subnets: BTreeMap<String, String>,
    /// At most this many spot instances per `CreateFleet` (the rest: insufficient capacity).
    spot_cap: Option<u32>,
    /// Action → how long its next call is held before it is relayed (a slow cloud API).
    hold: BTreeMap<String, std::time::Duration>,
    /// Action → how long every one of its calls is held (a cloud slow for a while).
    hold_every: BTreeMap<String, std::time::Duration>,
    /// Auto Scaling group → the status message of the failed activity of each of its launches.
    fail_groups: BTreeMap<String, String>,
    /// (group, start time, status message) of each failed activity recorded.
    activities: Vec<(String, String, String)>,
    /// Auto Scaling group → the desired capacity its last `SetDesiredCapacity` asked (none yet:
    /// `None`), for groups whose launches never complete ([`FaultProxy::slow_scaling`]).
    slow_groups: BTreeMap<String, Option<u32>>,
    /// (group, desired capacity) of every `SetDesiredCapacity`, in order.
    desired: Vec<(String, u32)>,
    /// Every action seen, in order (when relayed or answered, so after any hold).
    calls: Vec<String>,
    /// Every action held, in order, counted when its hold begins.
    held: Vec<String>,
    /// What `DescribeCapacityReservations` answers (moto has no such call).
    capacity_reservations: Vec<FakeReservation>,
    /// Capacity reservation → error code of every `RunInstances` that targets it (moto keeps
    /// no reservations, so it never refuses one).
    fail_reservations: BTreeMap<String, String>,
    /// Every request's form parameters, by action, in order.
    requests: Vec<(String, BTreeMap<String, String>)>,
}

/// A capacity reservation as `DescribeCapacityReservations` describes it (EC2's field names).
#[derive(Clone, Debug, Default)]
pub struct FakeReservation {
    pub id: String,
    /// `default` or `capacity-block` (`reservationType`).
    pub reservation_type: String,
    pub instance_type: String,
    pub zone: String,
    pub total: u32,
    pub available: u32,
    /// `active` or `scheduled` (the states the provider asks for), or another.
    pub state: String,
    /// ISO 8601 times, as EC2 writes them.
    pub start: Option<String>,
    pub end: Option<String>,
    pub tags: Vec<(String, String)>,
}

impl FakeReservation {
    fn xml(&self) -> String {
        let opt = |tag: &str, v: &Option<String>| {
            v.as_ref()
                .map(|v| format!("<{tag}>{v}</{tag}>"))
                .unwrap_or_default()
        };
        let tags: String = self
            .tags
            .iter()
            .map(|(k, v)| format!("<item><key>{k}</key><value>{v}</value></item>"))
            .collect();
        format!(
            "<item><capacityReservationId>{id}</capacityReservationId>\
             <ownerId>123456789012</ownerId><instanceType>{t}</instanceType>\
             <instancePlatform>Linux/UNIX</instancePlatform><availabilityZone>{z}</availabilityZone>\
             <tenancy>default</tenancy><totalInstanceCount>{total}</totalInstanceCount>\
             <availableInstanceCount>{available}</availableInstanceCount><state>{state}</state>\
             {start}{end}<endDateType>{end_type}</endDateType>\
             <instanceMatchCriteria>{criteria}</instanceMatchCriteria>\
             <reservationType>{kind}</reservationType><tagSet>{tags}</tagSet></item>",
            id = self.id,
            t = self.instance_type,
            z = self.zone,
            total = self.total,
            available = self.available,
            state = self.state,
            start = opt("startDate", &self.start),
            end = opt("endDate", &self.end),
            end_type = if self.end.is_some() { "limited" } else { "unlimited" },
            criteria = if self.reservation_type == "capacity-block" {
                "targeted"
            } else {
                "open"
            },
            kind = self.reservation_type,
        )
    }
}

/// `DescribeCapacityReservations`' answer: the reservations in the states its `state` filter
/// asks for (every one without a filter).
fn describe_capacity_reservations(params: &[(String, String)], all: &[FakeReservation]) -> String {
    let mut states: Vec<&str> = Vec::new();
    let mut n = 1;
    while let Some((_, name)) = params
        .iter()
        .find(|(k, _)| *k == format!("Filter.{n}.Name"))
    {
        if name == "state" {
            let prefix = format!("Filter.{n}.Value.");
            states.extend(
                params
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, v)| v.as_str()),
            );
        }
        n += 1;
    }
    let items: String = all
        .iter()
        .filter(|r| states.is_empty() || states.contains(&r.state.as_str()))
        .map(FakeReservation::xml)
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeCapacityReservationsResponse \
         xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId>\
         <capacityReservationSet>{items}</capacityReservationSet>\
         </DescribeCapacityReservationsResponse>"
    )
}

/// The proxy; it serves until the test's runtime ends.
pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: Arc<Mutex<Faults>>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let faults = Arc::new(Mutex::new(Faults::default()));
        let f = faults.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(connection(sock, upstream, f.clone()));
            }
        });
        FaultProxy { addr, faults }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `times` calls of `action` are throttled.
    pub fn throttle(&self, action: &str, times: u32) {
        self.faults
            .lock()
            .unwrap()
            .throttle
            .insert(action.to_string(), times);
    }

    /// The next `times` calls of `action` fail with a 500 `InternalError` (0: none do).
    pub fn fail(&self, action: &str, times: u32) {
        self.faults
            .lock()
            .unwrap()
            .fail
            .insert(action.to_string(), times);
    }

    /// `DescribeSpotPriceHistory` answers `price` for `instance_type` in `zone`.
    pub fn set_spot_price(&self, instance_type: &str, zone: &str, price: &str) {
        self.faults.lock().unwrap().spot_prices.insert(
            (instance_type.to_string(), zone.to_string()),
            price.to_string(),
        );
    }

    /// `CreateFleet` overrides in `subnet` fail with `code` instead of launching.
    pub fn fail_subnet(&self, subnet: &str, code: &str) {
        self.faults
            .lock()
            .unwrap()
            .fail_subnets
            .insert(subnet.to_string(), code.to_string());
    }

    /// The next call of `action` is held for `how_long` before it is relayed.
    pub fn hold_next(&self, action: &str, how_long: std::time::Duration) {
        self.faults
            .lock()
            .unwrap()
            .hold
            .insert(action.to_string(), how_long);
    }

    /// Every call of `action` is held for `how_long` before it is relayed, until
    /// [`FaultProxy::release`].
    pub fn hold_every(&self, action: &str, how_long: std::time::Duration) {
        self.faults
            .lock()
            .unwrap()
            .hold_every
            .insert(action.to_string(), how_long);
    }

    /// Calls are relayed at once again.
    pub fn release(&self) {
        let mut f = self.faults.lock().unwrap();
        f.hold.clear();
        f.hold_every.clear();
    }

    /// The account's capacity reservations, as `DescribeCapacityReservations` answers them.
    pub fn set_capacity_reservations(&self, reservations: Vec<FakeReservation>) {
        self.faults.lock().unwrap().capacity_reservations = reservations;
    }

    /// Spot fleets launch at most `n` instances; the rest fail for lack of capacity.
    pub fn cap_spot(&self, n: u32) {
        self.faults.lock().unwrap().spot_cap = Some(n);
    }

    /// Every later `SetDesiredCapacity` of Auto Scaling group `group` fails: nothing is launched
    /// and a `Failed` scaling activity with `message` is recorded for the group.
    pub fn fail_scaling(&self, group: &str, message: &str) {
        self.faults
            .lock()
            .unwrap()
            .fail_groups
            .insert(group.to_string(), message.to_string());
    }

    /// `SetDesiredCapacity` of Auto Scaling group `group` reaches moto again (after
    /// [`FaultProxy::fail_scaling`]); the failed activities recorded stay.
    pub fn heal_scaling(&self, group: &str) {
        self.faults.lock().unwrap().fail_groups.remove(group);
    }

    /// Every later `SetDesiredCapacity` of Auto Scaling group `group` is answered by the relay
    /// without reaching moto, as a launch still under way: no instance is launched and no
    /// activity fails, and `DescribeAutoScalingGroups` answers the desired capacity it asked
    /// (moto launches a group's instances at once, so it cannot be slow).
    pub fn slow_scaling(&self, group: &str) {
        self.faults
            .lock()
            .unwrap()
            .slow_groups
            .insert(group.to_string(), None);
    }

    /// The `SetDesiredCapacity` calls that reached the relay for `group`, in order: the desired
    /// capacity each asked for (whether it failed or was relayed).
    pub fn desired_asked(&self, group: &str) -> Vec<u32> {
        self.faults
            .lock()
            .unwrap()
            .desired
            .iter()
            .filter(|(g, _)| g == group)
            .map(|(_, n)| *n)
            .collect()
    }

    /// Every later `RunInstances` that targets capacity reservation `id`
    /// (`CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId`) fails
    /// with `code` (EC2's HTTP 400 error shape) without reaching moto.
    pub fn fail_reservation(&self, id: &str, code: &str) {
        self.faults
            .lock()
            .unwrap()
            .fail_reservations
            .insert(id.to_string(), code.to_string());
    }

    /// The form parameters of every call of `action` that reached the relay, in order (what the
    /// SDK sent, before any rewriting).
    pub fn requests_of(&self, action: &str) -> Vec<BTreeMap<String, String>> {
        self.faults
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|(a, _)| a == action)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Calls of `action` held (by [`FaultProxy::hold_next`] or [`FaultProxy::hold_every`]),
    /// counted as their hold begins: also those still held, or given up by the caller.
    pub fn held_calls_of(&self, action: &str) -> usize {
        self.faults
            .lock()
            .unwrap()
            .held
            .iter()
            .filter(|a| *a == action)
            .count()
    }

    pub fn calls_of(&self, action: &str) -> usize {
        self.faults
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|a| *a == action)
            .count()
    }
}

async fn connection(mut sock: TcpStream, upstream: SocketAddr, faults: Arc<Mutex<Faults>>) {
    let mut buf = Vec::new();
    while let Ok(Some((head, body))) = read_message(&mut sock, &mut buf).await {
        let Ok(resp) = handle(&head, body, upstream, &faults).await else {
            return;
        };
        if sock.write_all(&resp).await.is_err() {
            return;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads one HTTP/1.1 message (head, body) with a `Content-Length` body; `None` at EOF.
async fn read_message(
    sock: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut chunk = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Ok(Some((head, body)))
}

fn response(status: u16, reason: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn encode_form(params: &[(String, String)]) -> Vec<u8> {
    params
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors>\
<RequestID>fault-proxy</RequestID></Response>";

const INTERNAL_ERROR: &str =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
<Code>InternalError</Code><Message>An internal error has occurred.</Message></Error></Errors>\
<RequestID>fault-proxy</RequestID></Response>";

const SET_DESIRED_OK: &str = "<SetDesiredCapacityResponse \
xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><ResponseMetadata><RequestId>fault-proxy\
</RequestId></ResponseMetadata></SetDesiredCapacityResponse>";

/// The groups of a `DescribeAutoScalingGroups` answer: each one's `<member>` element, as byte
/// ranges (its instances and tags are members nested in it).
fn group_members(xml: &str) -> Vec<(usize, usize)> {
    let Some(mut i) = xml.find("<AutoScalingGroups>") else {
        return Vec::new();
    };
    let end = xml.rfind("</AutoScalingGroups>").unwrap_or(xml.len());
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut open = 0;
    while i < end {
        let o = xml[i..end].find("<member>").map(|p| p + i);
        let c = xml[i..end].find("</member>").map(|p| p + i);
        match (o, c) {
            (Some(o), Some(c)) if o < c => {
                if depth == 0 {
                    open = o;
                }
                depth += 1;
                i = o + "<member>".len();
            }
            (_, Some(c)) if depth > 0 => {
                depth -= 1;
                i = c + "</member>".len();
                if depth == 0 {
                    out.push((open, i));
                }
            }
            _ => break,
        }
    }
    out
}

/// A `DescribeAutoScalingGroups` answer with the desired capacity of each slow group as its
/// last `SetDesiredCapacity` asked.
fn rewrite_desired(xml: &str, slow: &BTreeMap<String, Option<u32>>) -> String {
    let mut out = xml.to_string();
    for (group, n) in slow {
        let Some(n) = n else { continue };
        let name = format!("<AutoScalingGroupName>{group}</AutoScalingGroupName>");
        let Some((s, e)) = group_members(&out)
            .into_iter()
            .find(|(s, e)| out[*s..*e].contains(&name))
        else {
            continue;
        };
        let member = &out[s..e];
        let (Some(a), Some(b)) = (
            member.find("<DesiredCapacity>"),
            member.find("</DesiredCapacity>"),
        ) else {
            continue;
        };
        let replaced = format!("{}<DesiredCapacity>{n}{}", &member[..a], &member[b..]);
        out.replace_range(s..e, &replaced);
    }
    out
}

/// `DescribeScalingActivities` for `group`: its failed activities, newest first.
fn scaling_activities(group: &str, activities: &[(String, String, String)]) -> String {
    let mut members = String::new();
    for (i, (g, at, message)) in activities.iter().enumerate().rev() {
        if g != group {
            continue;
        }
        members.push_str(&format!(
            "<member><ActivityId>fault-proxy-{i}</ActivityId><AutoScalingGroupName>{g}\
             </AutoScalingGroupName><Description>Launching a new EC2 instance.  Status Reason: \
             {message}</Description><Cause>At {at} a user request update of AutoScalingGroup \
             constraints changed the desired capacity.</Cause><StartTime>{at}</StartTime>\
             <EndTime>{at}</EndTime><StatusCode>Failed</StatusCode><StatusMessage>{message}\
             </StatusMessage><Progress>100</Progress></member>"
        ));
    }
    format!(
        "<DescribeScalingActivitiesResponse \
         xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><DescribeScalingActivitiesResult>\
         <Activities>{members}</Activities></DescribeScalingActivitiesResult><ResponseMetadata>\
         <RequestId>fault-proxy</RequestId></ResponseMetadata></DescribeScalingActivitiesResponse>"
    )
}

/// Now as ISO 8601 in UTC with milliseconds (`2026-11-27T20:01:02.345Z`).
fn iso_now() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Days since 1970-01-01 → civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000
    )
}

/// The text between `<tag>` and `</tag>` in `item`.
fn element<'a>(item: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = item.find(&open)? + open.len();
    let len = item[start..].find(&format!("</{tag}>"))?;
    Some(&item[start..start + len])
}

/// Puts the configured prices into a `DescribeSpotPriceHistory` response.
fn rewrite_spot_prices(body: &str, prices: &BTreeMap<(String, String), String>) -> String {
    let mut items = body.split("<item>");
    let mut out = items.next().unwrap_or_default().to_string();
    for item in items {
        out.push_str("<item>");
        let key = element(item, "instanceType")
            .zip(element(item, "availabilityZone"))
            .map(|(t, z)| (t.to_string(), z.to_string()));
        match (key.and_then(|k| prices.get(&k)), element(item, "spotPrice")) {
            (Some(price), Some(old)) => out.push_str(&item.replacen(
                &format!("<spotPrice>{old}</spotPrice>"),
                &format!("<spotPrice>{price}</spotPrice>"),
                1,
            )),
            _ => out.push_str(item),
        }
    }
    out
}

/// One error of `CreateFleet`'s `errorSet`, as EC2 documents it.
struct FleetError {
    instance_type: String,
    subnet: String,
    lifecycle: String,
    code: String,
}

impl FleetError {
    fn xml(&self) -> String {
        format!(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification>\
             <launchTemplateName>gpu-nodes</launchTemplateName><version>1</version>\
             </launchTemplateSpecification><overrides><instanceType>{t}</instanceType>\
             <subnetId>{s}</subnetId></overrides></launchTemplateAndOverrides>\
             <lifecycle>{l}</lifecycle><errorCode>{c}</errorCode><errorMessage>Injected {c} for \
             {t} in {s}.</errorMessage></item>",
            t = self.instance_type,
            s = self.subnet,
            l = self.lifecycle,
            c = self.code,
        )
    }
}

const OVERRIDES: &str = "LaunchTemplateConfigs.1.Overrides.";

/// Applies the faults to a `CreateFleet` request: drops failing overrides (renumbering the rest)
/// and caps spot capacity. Returns the errors to add to the response, and whether anything is
/// left to launch.
fn rewrite_create_fleet(params: &mut Vec<(String, String)>, f: &Faults) -> (Vec<FleetError>, bool) {
    let get = |ps: &[(String, String)], k: &str| {
        ps.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.clone())
    };
    let lifecycle = get(
        params,
        "TargetCapacitySpecification.DefaultTargetCapacityType",
    )
    .unwrap_or_else(|| "on-demand".into());
    // Override index → fields.
    let mut overrides: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
    for (k, v) in params.iter() {
        if let Some(rest) = k.strip_prefix(OVERRIDES) {
            if let Some((n, field)) = rest.split_once('.') {
                if let Ok(n) = n.parse::<u32>() {
                    overrides
                        .entry(n)
                        .or_default()
                        .insert(field.to_string(), v.clone());
                }
            }
        }
    }
    let mut errors = Vec::new();
    let mut kept = Vec::new();
    for fields in overrides.values() {
        let subnet = fields.get("SubnetId").cloned().unwrap_or_default();
        let instance_type = fields.get("InstanceType").cloned().unwrap_or_default();
        match f.fail_subnets.get(&subnet) {
            Some(code) => errors.push(FleetError {
                instance_type,
                subnet,
                lifecycle: lifecycle.clone(),
                code: code.clone(),
            }),
            None => kept.push(fields.clone()),
        }
    }
    params.retain(|(k, _)| !k.starts_with(OVERRIDES));
    for (i, fields) in kept.iter().enumerate() {
        for (field, v) in fields {
            params.push((format!("{OVERRIDES}{}.{field}", i + 1), v.clone()));
        }
    }
    let mut launchable = !kept.is_empty();
    if let (Some(cap), "spot", Some(first)) = (f.spot_cap, lifecycle.as_str(), kept.first()) {
        let total: u32 = get(params, "TargetCapacitySpecification.TotalTargetCapacity")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if total > cap {
            for (k, v) in params.iter_mut() {
                if k == "TargetCapacitySpecification.TotalTargetCapacity"
                    || k == "TargetCapacitySpecification.SpotTargetCapacity"
                {
                    *v = cap.to_string();
                }
            }
            errors.push(FleetError {
                instance_type: first.get("InstanceType").cloned().unwrap_or_default(),
                subnet: first.get("SubnetId").cloned().unwrap_or_default(),
                lifecycle: lifecycle.clone(),
                code: "InsufficientInstanceCapacity".into(),
            });
            launchable &= cap > 0;
        }
    }
    (errors, launchable)
}

async fn forward(
    head: &str,
    body: &[u8],
    upstream: SocketAddr,
) -> std::io::Result<(u16, String, String, Vec<u8>)> {
    let mut up = TcpStream::connect(upstream).await?;
    let mut out = String::new();
    for (i, line) in head.split("\r\n").enumerate() {
        if line.is_empty() {
            continue;
        }
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if i > 0
            && matches!(
                name.as_str(),
                "content-length" | "connection" | "transfer-encoding"
            )
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    up.write_all(out.as_bytes()).await?;
    up.write_all(body).await?;
    let mut raw = Vec::new();
    up.read_to_end(&mut raw).await?;
    let head_end = find(&raw, b"\r\n\r\n").map_or(raw.len(), |i| i + 4);
    let rhead = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut rbody = raw[head_end..].to_vec();
    if header(&rhead, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        rbody = dechunk(&rbody);
    } else if let Some(len) = header(&rhead, "content-length").and_then(|v| v.parse().ok()) {
        rbody.truncate(len);
    }
    let mut status = rhead.lines().next().unwrap_or("").splitn(3, ' ').skip(1);
    let code = status.next().and_then(|c| c.parse().ok()).unwrap_or(502);
    let reason = status.next().unwrap_or("").to_string();
    let ct = header(&rhead, "content-type")
        .unwrap_or("text/xml")
        .to_string();
    Ok((code, reason, ct, rbody))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = find(b, b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..i])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + size]);
        b = &b[i + 2 + size + 2..];
    }
    out
}

async fn handle(
    head: &str,
    body: Vec<u8>,
    upstream: SocketAddr,
    faults: &Mutex<Faults>,
) -> std::io::Result<Vec<u8>> {
    let mut params = parse_form(&body);
    // EC2's query protocol names the action in the form; JSON protocols (SQS) in a header
    // (`X-Amz-Target: AmazonSQS.ReceiveMessage`).
    let action = params
        .iter()
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.clone())
        .or_else(|| {
            header(head, "x-amz-target")
                .and_then(|t| t.rsplit('.').next())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let held = {
        let mut f = faults.lock().unwrap();
        let d = f
            .hold
            .remove(&action)
            .or_else(|| f.hold_every.get(&action).copied());
        if d.is_some() {
            f.held.push(action.clone());
        }
        d
    };
    if let Some(d) = held {
        tokio::time::sleep(d).await;
    }
    let (errors, launchable) = {
        let mut f = faults.lock().unwrap();
        f.calls.push(action.clone());
        f.requests
            .push((action.clone(), params.iter().cloned().collect()));
        if let Some(n) = f.throttle.get_mut(&action).filter(|n| **n > 0) {
            *n -= 1;
            return Ok(response(
                503,
                "Service Unavailable",
                "text/xml",
                THROTTLED.as_bytes(),
            ));
        }
        if let Some(n) = f.fail.get_mut(&action).filter(|n| **n > 0) {
            *n -= 1;
            return Ok(response(
                500,
                "Internal Server Error",
                "text/xml",
                INTERNAL_ERROR.as_bytes(),
            ));
        }
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if action == "SetDesiredCapacity" {
            let group = param("AutoScalingGroupName");
            let n = param("DesiredCapacity").parse().unwrap_or(0);
            f.desired.push((group.clone(), n));
            if let Some(last) = f.slow_groups.get_mut(&group) {
                *last = Some(n);
                return Ok(response(200, "OK", "text/xml", SET_DESIRED_OK.as_bytes()));
            }
            if let Some(message) = f.fail_groups.get(&group).cloned() {
                f.activities.push((group, iso_now(), message));
                return Ok(response(200, "OK", "text/xml", SET_DESIRED_OK.as_bytes()));
            }
        }
        if action == "RunInstances" {
            let target = param(
                "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId",
            );
            if let Some(code) = f.fail_reservations.get(&target) {
                let xml = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
                     <Code>{code}</Code><Message>Injected {code} for {target}.</Message></Error>\
                     </Errors><RequestID>fault-proxy</RequestID></Response>"
                );
                return Ok(response(400, "Bad Request", "text/xml", xml.as_bytes()));
            }
        }
        if action == "DescribeScalingActivities" {
            let group = param("AutoScalingGroupName");
            let xml = scaling_activities(&group, &f.activities);
            return Ok(response(200, "OK", "text/xml", xml.as_bytes()));
        }
        if action == "CreateFleet" {
            rewrite_create_fleet(&mut params, &f)
        } else {
            (Vec::new(), true)
        }
    };
    if action == "DescribeCapacityReservations" {
        let all = faults.lock().unwrap().capacity_reservations.clone();
        let xml = describe_capacity_reservations(&params, &all);
        return Ok(response(200, "OK", "text/xml", xml.as_bytes()));
    }
    if action == "DescribeAutoScalingGroups" {
        let slow = faults.lock().unwrap().slow_groups.clone();
        if slow.values().any(Option::is_some) {
            let (code, reason, ct, rbody) = forward(head, &body, upstream).await?;
            let text = rewrite_desired(&String::from_utf8_lossy(&rbody), &slow);
            return Ok(response(code, &reason, &ct, text.as_bytes()));
        }
    }
    if action == "DescribeSpotPriceHistory" {
        let (code, reason, ct, rbody) = forward(head, &body, upstream).await?;
        let prices = faults.lock().unwrap().spot_prices.clone();
        let text = rewrite_spot_prices(&String::from_utf8_lossy(&rbody), &prices);
        return Ok(response(code, &reason, &ct, text.as_bytes()));
    }
    if action != "CreateFleet" || errors.is_empty() {
        let (code, reason, ct, rbody) = forward(head, &body, upstream).await?;
        return Ok(response(code, &reason, &ct, &rbody));
    }
    let error_xml = format!(
        "<errorSet>{}</errorSet>",
        errors.iter().map(FleetError::xml).collect::<String>()
    );
    if !launchable {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CreateFleetResponse \
             xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-proxy</requestId>\
             <fleetId>fleet-00000000-0000-0000-0000-000000000000</fleetId>{error_xml}\
             <fleetInstanceSet/></CreateFleetResponse>"
        );
        return Ok(response(200, "OK", "text/xml", xml.as_bytes()));
    }
    let (code, reason, ct, rbody) = forward(head, &encode_form(&params), upstream).await?;
    let text = String::from_utf8_lossy(&rbody)
        .replace("<errorSet/>", "")
        .replace("<errorSet></errorSet>", "");
    let text = match text.rfind("</CreateFleetResponse>") {
        Some(i) if code == 200 => format!("{}{error_xml}{}", &text[..i], &text[i..]),
        _ => text,
    };
    Ok(response(code, &reason, &ct, text.as_bytes()))
}
