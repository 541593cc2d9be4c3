//! Pools backed by Auto Scaling groups, the client part: groups read with
//! `DescribeAutoScalingGroups` (named, or discovered by their tags), grown with
//! `SetDesiredCapacity` and followed through `DescribeScalingActivities`, their instances taken
//! out one by one with `TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity)`.
//! What to grow and what to refuse is decided in [`crate::groups`].

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_autoscaling::types::{Filter as AsgFilter, ScalingActivityStatusCode, Tag as AsgTag};
use aws_sdk_ec2::types::Filter;

use gpu_node_autoscaler_provider::{
    CapacityType, Instance, InstanceState, LaunchRequest, LaunchResult, OfferingKey, ProviderError,
};

use super::{now_ms, AsgPool, AwsProvider};
use crate::errors::ApiError;
use crate::groups::{self, Group, GroupInstance};
use crate::settings::{cluster_autoscaler_tags, AutoScalingGroups, TagMatch};

/// What the provider remembers of its group launches (the groups' own tags remember the rest
/// across restarts).
#[derive(Debug, Default)]
pub(super) struct GroupState {
    /// Group → until when (ms) its launches are not tried again: its last one failed.
    failed_until: BTreeMap<String, i64>,
    /// Instance id → the launch id it was launched for.
    launch_of: BTreeMap<String, String>,
    /// Launch id → how many instances it asked the groups for (raises whose activity failed
    /// not counted).
    asked: BTreeMap<String, u32>,
    /// Raises whose instances had not all come when the group wait ran out.
    slow: Vec<SlowRaise>,
}

/// A group raised for a launch whose instances had not all come when the group wait ran out:
/// what has still not come at `deadline_ms` is given back.
#[derive(Clone, Debug)]
struct SlowRaise {
    group: String,
    launch_id: String,
    /// How many of its instances had not come.
    missing: u32,
    /// The group's instances when the wait ran out: those that come later are the raise's.
    seen: BTreeSet<String>,
    /// When it was raised plus the policy's `maxNodeProvisionTime` (ms).
    deadline_ms: i64,
}

impl AwsProvider {
    pub(super) fn group_pool(&self, name: &str) -> Option<&AsgPool> {
        self.config.group_pools.iter().find(|p| p.name == name)
    }

    /// The tags a pool's groups are discovered by, when it discovers them.
    fn wanted_tags(&self, pool: &AsgPool) -> Option<Vec<TagMatch>> {
        match &pool.groups {
            AutoScalingGroups::Named(_) => None,
            AutoScalingGroups::Discovered(t) if t.is_empty() => {
                Some(cluster_autoscaler_tags(&self.config.cluster))
            }
            AutoScalingGroups::Discovered(t) => Some(t.clone()),
        }
    }

    /// The pool's groups, in its order of preference; named groups that do not exist are
    /// left out (see [`AwsProvider::group_report`]).
    pub async fn pool_groups(&self, pool: &AsgPool) -> Result<Vec<Group>, ProviderError> {
        let wanted = self.wanted_tags(pool);
        let named = match &pool.groups {
            AutoScalingGroups::Named(n) => Some(n.clone()),
            AutoScalingGroups::Discovered(_) => None,
        };
        let mut raw = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .call(
                    "DescribeAutoScalingGroups",
                    &self.limits.autoscaling,
                    || {
                        let mut req = self
                            .autoscaling
                            .describe_auto_scaling_groups()
                            .set_next_token(token.clone());
                        match (&named, &wanted) {
                            (Some(names), _) => {
                                req = req.set_auto_scaling_group_names(Some(names.clone()))
                            }
                            (None, Some(tags)) => {
                                if let Some(first) = tags.first() {
                                    req = req.filters(
                                        AsgFilter::builder()
                                            .name("tag-key")
                                            .values(first.key.clone())
                                            .build(),
                                    );
                                }
                            }
                            (None, None) => {}
                        }
                        req.send()
                    },
                )
                .await
                .map_err(ApiError::into_provider_error)?;
            raw.extend(resp.auto_scaling_groups().iter().cloned());
            token = resp
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        let mut out = Vec::new();
        for g in &raw {
            let tags: BTreeMap<String, String> = g
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
                .collect();
            if let Some(w) = &wanted {
                if !groups::matches(&tags, w) {
                    continue;
                }
            }
            out.push(self.read_group(g, tags).await?);
        }
        groups::order(&mut out, named.as_deref());
        Ok(out)
    }

    /// One group: its sizes, zones, instances, and its instance types and capacity type from its
    /// `MixedInstancesPolicy`, else its launch template, else its launch configuration.
    async fn read_group(
        &self,
        g: &aws_sdk_autoscaling::types::AutoScalingGroup,
        tags: BTreeMap<String, String>,
    ) -> Result<Group, ProviderError> {
        let size = |v: Option<i32>| v.unwrap_or(0).max(0) as u32;
        let mut types: Vec<String> = Vec::new();
        let mut spot = false;
        let mut source = String::from("no launch template");
        let mut template = g.launch_template().cloned();
        if let Some(m) = g.mixed_instances_policy() {
            if let Some(lt) = m.launch_template() {
                for o in lt.overrides() {
                    if let Some(t) = o.instance_type() {
                        if !types.iter().any(|x| x == t) {
                            types.push(t.to_string());
                        }
                    }
                }
                if template.is_none() {
                    template = lt.launch_template_specification().cloned();
                }
                if !types.is_empty() {
                    source = "MixedInstancesPolicy".to_string();
                }
            }
            if let Some(d) = m.instances_distribution() {
                spot = d.on_demand_base_capacity().unwrap_or(0) == 0
                    && d.on_demand_percentage_above_base_capacity().unwrap_or(100) == 0;
            }
        }
        if types.is_empty() {
            if let Some(lt) = &template {
                let name = lt
                    .launch_template_id()
                    .or(lt.launch_template_name())
                    .unwrap_or_default()
                    .to_string();
                source = format!("launch template {name}");
                let (t, market_spot) = self.launch_template_type(lt).await?;
                types.extend(t);
                spot |= market_spot;
            } else if let Some(lc) = g.launch_configuration_name() {
                source = format!("launch configuration {lc}");
                let resp = self
                    .call(
                        "DescribeLaunchConfigurations",
                        &self.limits.autoscaling,
                        || {
                            self.autoscaling
                                .describe_launch_configurations()
                                .launch_configuration_names(lc)
                                .send()
                        },
                    )
                    .await
                    .map_err(ApiError::into_provider_error)?;
                types.extend(
                    resp.launch_configurations()
                        .iter()
                        .filter_map(|c| c.instance_type().map(str::to_string)),
                );
            }
        }
        let instances = g
            .instances()
            .iter()
            .filter_map(|i| {
                Some(GroupInstance {
                    id: i.instance_id()?.to_string(),
                    zone: i.availability_zone().unwrap_or_default().to_string(),
                    instance_type: i.instance_type().unwrap_or_default().to_string(),
                    lifecycle: i
                        .lifecycle_state()
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default(),
                    protected_from_scale_in: i.protected_from_scale_in().unwrap_or(false),
                })
            })
            .collect();
        let capacity_type = groups::capacity_type_of(&tags, spot);
        Ok(Group {
            name: g.auto_scaling_group_name().unwrap_or_default().to_string(),
            min: size(g.min_size()),
            max: size(g.max_size()),
            desired: size(g.desired_capacity()),
            instance_types: types,
            zones: g.availability_zones().to_vec(),
            capacity_type,
            tags,
            instances,
            source,
        })
    }

    /// A launch template version's instance type (none when it sets none) and whether it
    /// buys spot (`InstanceMarketOptions`).
    async fn launch_template_type(
        &self,
        lt: &aws_sdk_autoscaling::types::LaunchTemplateSpecification,
    ) -> Result<(Option<String>, bool), ProviderError> {
        let version = lt.version().unwrap_or("$Default").to_string();
        let resp = self
            .call(
                "DescribeLaunchTemplateVersions",
                &self.limits.describe_instances,
                || {
                    let req = self
                        .client
                        .describe_launch_template_versions()
                        .versions(version.clone());
                    match (lt.launch_template_id(), lt.launch_template_name()) {
                        (Some(id), _) => req.launch_template_id(id),
                        (None, Some(name)) => req.launch_template_name(name),
                        (None, None) => req,
                    }
                    .send()
                },
            )
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) if e.code.as_deref().is_some_and(|c| c.contains("NotFound")) => {
                return Ok((None, false))
            }
            Err(e) => return Err(e.into_provider_error()),
        };
        let data = resp
            .launch_template_versions()
            .first()
            .and_then(|v| v.launch_template_data());
        let t = data
            .and_then(|d| d.instance_type())
            .map(|t| t.as_str().to_string());
        let spot = data
            .and_then(|d| d.instance_market_options())
            .and_then(|m| m.market_type())
            .is_some_and(|m| m.as_str() == "spot");
        Ok((t, spot))
    }

    /// The labels and taints of an EKS managed node group (`DescribeNodegroup`); `None` when
    /// EKS does not know it (the group's tags alone then say what its Nodes carry). Any other
    /// failure is an error naming the permission it needs.
    pub(super) async fn describe_node_group(
        &self,
        cluster: &str,
        node_group: &str,
    ) -> Result<Option<groups::ManagedNodeGroup>, ProviderError> {
        let resp = self
            .call("DescribeNodegroup", &self.limits.autoscaling, || {
                self.eks
                    .describe_nodegroup()
                    .cluster_name(cluster)
                    .nodegroup_name(node_group)
                    .send()
            })
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) if e.code.as_deref() == Some("ResourceNotFoundException") => return Ok(None),
            Err(e) => {
                let mut e = e.into_provider_error();
                if let ProviderError::InvalidRequest { message }
                | ProviderError::Other { message } = &mut e
                {
                    message.push_str(&format!(
                        " (EKS managed node group {node_group} of cluster {cluster}: the \
                         controller's IAM policy needs eks:DescribeNodegroup)"
                    ));
                }
                return Err(e);
            }
        };
        let Some(ng) = resp.nodegroup() else {
            return Ok(None);
        };
        let labels = ng
            .labels()
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let taints = ng
            .taints()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_string(),
                    t.value().unwrap_or_default().to_string(),
                    groups::eks_taint_effect(t.effect()?.as_str())?.to_string(),
                ))
            })
            .collect();
        Ok(Some(groups::ManagedNodeGroup { labels, taints }))
    }

    /// Every group pool's groups, described for people, and what each pool lacks
    /// (`check-policy --provider aws`): `(found, problems)`.
    pub async fn group_report(&self) -> Result<(Vec<String>, Vec<String>), ProviderError> {
        let mut found = Vec::new();
        let mut problems = Vec::new();
        for p in &self.config.group_pools {
            let gs = self.pool_groups(p).await?;
            if let AutoScalingGroups::Named(names) = &p.groups {
                for n in names {
                    if !gs.iter().any(|g| &g.name == n) {
                        problems.push(format!(
                            "pool {}: aws.autoScalingGroups.names: Auto Scaling group {n} not found",
                            p.name
                        ));
                    }
                }
            }
            if gs.is_empty() {
                let how = match self.wanted_tags(p) {
                    Some(tags) => format!(
                        "with the tags {}",
                        tags.iter()
                            .map(|t| match &t.value {
                                Some(v) => format!("{}={v}", t.key),
                                None => t.key.clone(),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => "of those names".to_string(),
                };
                problems.push(format!(
                    "pool {}: aws.autoScalingGroups: no Auto Scaling group {how}",
                    p.name
                ));
                continue;
            }
            for g in &gs {
                let managed = match groups::managed_node_group(&g.tags) {
                    Some((cluster, group)) => self.describe_node_group(cluster, group).await?,
                    None => None,
                };
                found.push(format!(
                    "pool {}: {}",
                    p.name,
                    groups::describe(g, managed.as_ref())
                ));
            }
            for m in groups::missing(&gs, &p.instance_types, &p.zones, &p.capacity_types) {
                problems.push(format!("pool {}: aws.autoScalingGroups: {m}", p.name));
            }
        }
        Ok((found, problems))
    }

    /// The groups whose launches failed lately.
    fn failed_groups(&self) -> BTreeSet<String> {
        let now = now_ms();
        let state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        state
            .failed_until
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(g, _)| g.clone())
            .collect()
    }

    /// Offerings of the group pools: `(offering, on-demand price of its type, available)`, an
    /// offering available when a group that serves it has room and did not fail lately.
    pub(super) async fn group_offerings(
        &self,
    ) -> Result<Vec<(OfferingKey, f64, bool)>, ProviderError> {
        self.settle_slow_raises().await;
        let failed = self.failed_groups();
        let mut out: BTreeMap<OfferingKey, (f64, bool)> = BTreeMap::new();
        for p in &self.config.group_pools {
            for g in self.pool_groups(p).await? {
                let ok = groups::headroom(&g) > 0 && !failed.contains(&g.name);
                for t in &g.instance_types {
                    if !p.instance_types.is_empty() && !p.instance_types.contains(t) {
                        continue;
                    }
                    let Some(price) = p.on_demand_prices.get(t) else {
                        continue;
                    };
                    for z in &g.zones {
                        let key = OfferingKey {
                            instance_type: t.clone(),
                            zone: z.clone(),
                            capacity_type: g.capacity_type,
                        };
                        let e = out.entry(key).or_insert((*price, false));
                        e.1 |= ok;
                    }
                }
            }
        }
        Ok(out.into_iter().map(|(k, (p, a))| (k, p, a)).collect())
    }

    /// Grows the pool's groups for a launch: see the module's documentation.
    pub(super) async fn launch_in_groups(
        &self,
        pool: &AsgPool,
        request: &LaunchRequest,
    ) -> Result<LaunchResult, ProviderError> {
        let mut result = LaunchResult::default();
        let mut gs = self.pool_groups(pool).await?;
        // What this launch id asked for already: in this process, else as the groups' tags
        // recorded it (a repeat after a restart).
        let remembered = {
            let state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            state.asked.get(&request.launch_id).copied()
        };
        let asked = remembered.unwrap_or_else(|| {
            gs.iter()
                .filter_map(|g| g.tags.get(groups::TAG_LAST_LAUNCH))
                .filter_map(|v| groups::last_launch(v))
                .filter(|(id, _)| *id == request.launch_id)
                .map(|(_, n)| n)
                .sum()
        });
        let mut remaining = request.count.saturating_sub(asked);
        let mut skip = self.failed_groups();
        let offerings: Vec<OfferingKey> = request.offerings.clone();
        // Each round grows groups; a group whose launch fails is skipped in the next.
        for _round in 0..gs.len().max(1) {
            if remaining == 0 {
                break;
            }
            let (steps, _left) = groups::allocate(&gs, &offerings, remaining, &skip);
            if steps.is_empty() {
                break;
            }
            let mut failed_now = false;
            for step in steps {
                let g = gs[step.group].clone();
                match self.grow(&g, step.count, &request.launch_id).await {
                    Ok(Grown::Launched(new)) => {
                        remaining = remaining.saturating_sub(step.count);
                        gs[step.group].desired += step.count;
                        for i in new {
                            result.launched.push(self.group_instance(
                                pool,
                                &g,
                                &i,
                                &request.launch_id,
                                0,
                            ));
                        }
                    }
                    Ok(Grown::Failed(message)) => {
                        failed_now = true;
                        skip.insert(g.name.clone());
                        let e = if message.contains("quota") || message.contains("limit") {
                            ProviderError::QuotaExceeded {
                                message: format!("Auto Scaling group {}: {message}", g.name),
                            }
                        } else {
                            ProviderError::InsufficientCapacity {
                                offering: step.offering.clone(),
                            }
                        };
                        result.failures.push((step.offering.clone(), e));
                    }
                    Err(e) => {
                        if matches!(e, ProviderError::Throttled { .. })
                            && result.launched.is_empty()
                        {
                            return Err(e);
                        }
                        skip.insert(g.name.clone());
                        failed_now = true;
                        result.failures.push((step.offering.clone(), e));
                    }
                }
            }
            if !failed_now {
                break;
            }
        }
        // A failure of an offering another group launched is no failure of the offering.
        let launched: BTreeSet<(String, String, CapacityType)> = result
            .launched
            .iter()
            .map(|i| {
                (
                    i.offering.instance_type.clone(),
                    i.offering.zone.clone(),
                    i.offering.capacity_type,
                )
            })
            .collect();
        result.failures.retain(|(o, _)| {
            !launched.contains(&(o.instance_type.clone(), o.zone.clone(), o.capacity_type))
        });
        if remaining > 0 {
            // No group had room for the rest.
            for o in &offerings {
                let failed = result.failures.iter().any(|(k, _)| k == o);
                if !failed
                    && !gs
                        .iter()
                        .any(|g| groups::serves(g, o) && groups::headroom(g) > 0)
                {
                    result.failures.push((
                        o.clone(),
                        ProviderError::InsufficientCapacity {
                            offering: o.clone(),
                        },
                    ));
                }
            }
        }
        Ok(result)
    }

    /// Grows one group by `count` and follows the launch: the instances it brought, or why it
    /// failed (its scaling activity's message) after its desired capacity was given back.
    /// Records on the group how many instances `launch_id` asked of it (`TAG_LAST_LAUNCH`), for
    /// a restarted provider. Best effort: a failure only loses that memory.
    async fn tag_last_launch(&self, group: &str, launch_id: &str, count: u32) {
        let _ = self
            .call("CreateOrUpdateTags", &self.limits.autoscaling, || {
                self.autoscaling
                    .create_or_update_tags()
                    .tags(
                        AsgTag::builder()
                            .resource_id(group)
                            .resource_type("auto-scaling-group")
                            .key(groups::TAG_LAST_LAUNCH)
                            .value(groups::last_launch_value(launch_id, count))
                            .propagate_at_launch(false)
                            .build(),
                    )
                    .send()
            })
            .await;
    }

    async fn grow(&self, g: &Group, count: u32, launch_id: &str) -> Result<Grown, ProviderError> {
        let before: BTreeSet<String> = g.instances.iter().map(|i| i.id.clone()).collect();
        let target = g.desired + count;
        // Activities started from here on are this launch's (a second of slack for clocks).
        let since = now_ms() - 1_000;
        self.call("SetDesiredCapacity", &self.limits.scale, || {
            self.autoscaling
                .set_desired_capacity()
                .auto_scaling_group_name(&g.name)
                .desired_capacity(i32::try_from(target).unwrap_or(i32::MAX))
                .honor_cooldown(false)
                .send()
        })
        .await
        .map_err(ApiError::into_provider_error)?;
        {
            let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            *state.asked.entry(launch_id.to_string()).or_insert(0) += count;
        }
        // Best effort: remembered on the group for a restart.
        self.tag_last_launch(&g.name, launch_id, count).await;
        let deadline = std::time::Instant::now() + self.config.group_launch_wait;
        loop {
            if let Some(message) = self.failed_activity(&g.name, since).await? {
                {
                    let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                    state.failed_until.insert(
                        g.name.clone(),
                        now_ms() + self.config.group_failure_hold.as_millis() as i64,
                    );
                    // Nothing was launched for it: a repeat of the launch asks for it again.
                    if let Some(n) = state.asked.get_mut(launch_id) {
                        *n = n.saturating_sub(count);
                    }
                }
                self.give_back(&g.name).await?;
                // Best effort, as above: a restarted provider does not count it either.
                self.tag_last_launch(&g.name, launch_id, 0).await;
                return Ok(Grown::Failed(message));
            }
            let now = self.describe_group(&g.name).await?;
            let all: BTreeSet<String> = now
                .iter()
                .flat_map(|n| n.instances.iter().map(|i| i.id.clone()))
                .collect();
            let new: Vec<GroupInstance> = now
                .map(|n| {
                    n.instances
                        .into_iter()
                        .filter(|i| !before.contains(&i.id) && !i.leaving())
                        .collect()
                })
                .unwrap_or_default();
            if new.len() as u32 >= count || std::time::Instant::now() >= deadline {
                let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                let new: Vec<GroupInstance> = new.into_iter().take(count as usize).collect();
                for i in &new {
                    state.launch_of.insert(i.id.clone(), launch_id.to_string());
                }
                let missing = count.saturating_sub(new.len() as u32);
                if missing > 0 {
                    // Still under way: given back after the provisioning time if it never comes.
                    state.slow.push(SlowRaise {
                        group: g.name.clone(),
                        launch_id: launch_id.to_string(),
                        missing,
                        seen: before.union(&all).cloned().collect(),
                        deadline_ms: since
                            + 1_000
                            + self.config.group_provision_time.as_millis() as i64,
                    });
                }
                return Ok(Grown::Launched(new));
            }
            tokio::time::sleep(self.config.group_poll).await;
        }
    }

    /// Settles the slow raises whose provisioning time has passed (see [`SlowRaise`]): the
    /// instances that came since are the launch's; for those that never came the group's
    /// desired capacity is lowered by them ([`groups::give_back_unfulfilled`]: never below the
    /// instances it has, no instance picked) and the group counts as short, as after a failed
    /// activity. A raise whose group cannot be read now is settled at the next look.
    pub(super) async fn settle_slow_raises(&self) {
        let due: Vec<SlowRaise> = {
            let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            if state.slow.is_empty() {
                return;
            }
            let now = now_ms();
            let (due, later) = std::mem::take(&mut state.slow)
                .into_iter()
                .partition(|r| r.deadline_ms <= now);
            state.slow = later;
            due
        };
        for r in due {
            if self.settle_slow_raise(&r).await.is_err() {
                let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                state.slow.push(r);
            }
        }
    }

    async fn settle_slow_raise(&self, r: &SlowRaise) -> Result<(), ProviderError> {
        let Some(g) = self.describe_group(&r.group).await? else {
            return Ok(());
        };
        let came: Vec<String> = g
            .instances
            .iter()
            .filter(|i| !r.seen.contains(&i.id) && !i.leaving())
            .map(|i| i.id.clone())
            .take(r.missing as usize)
            .collect();
        let never = r.missing - came.len() as u32;
        if let Some(to) = groups::give_back_unfulfilled(&g, never) {
            self.call("SetDesiredCapacity", &self.limits.scale, || {
                self.autoscaling
                    .set_desired_capacity()
                    .auto_scaling_group_name(&r.group)
                    .desired_capacity(i32::try_from(to).unwrap_or(i32::MAX))
                    .honor_cooldown(false)
                    .send()
            })
            .await
            .map_err(ApiError::into_provider_error)?;
        }
        let mut state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        for id in came {
            state.launch_of.insert(id, r.launch_id.clone());
        }
        if never > 0 {
            state.failed_until.insert(
                r.group.clone(),
                now_ms() + self.config.group_failure_hold.as_millis() as i64,
            );
        }
        Ok(())
    }

    /// The message of a failed scaling activity of `group` started since `since_ms`.
    async fn failed_activity(
        &self,
        group: &str,
        since_ms: i64,
    ) -> Result<Option<String>, ProviderError> {
        let resp = self
            .call(
                "DescribeScalingActivities",
                &self.limits.autoscaling,
                || {
                    self.autoscaling
                        .describe_scaling_activities()
                        .auto_scaling_group_name(group)
                        .max_records(20)
                        .send()
                },
            )
            .await
            .map_err(ApiError::into_provider_error)?;
        Ok(resp.activities().iter().find_map(|a| {
            let at = a.start_time().and_then(|t| t.to_millis().ok()).unwrap_or(0);
            let failed = matches!(
                a.status_code(),
                Some(ScalingActivityStatusCode::Failed | ScalingActivityStatusCode::Cancelled)
            );
            (failed && at >= since_ms).then(|| {
                a.status_message()
                    .or(a.description())
                    .unwrap_or("scaling activity failed")
                    .to_string()
            })
        }))
    }

    /// After a failed launch: the group's desired capacity back to the instances it has, so
    /// that it does not launch them later on its own (never below them: it picks no instance
    /// to remove).
    async fn give_back(&self, group: &str) -> Result<(), ProviderError> {
        let Some(g) = self.describe_group(group).await? else {
            return Ok(());
        };
        if let Some(to) = groups::give_back(&g) {
            self.call("SetDesiredCapacity", &self.limits.scale, || {
                self.autoscaling
                    .set_desired_capacity()
                    .auto_scaling_group_name(group)
                    .desired_capacity(i32::try_from(to).unwrap_or(i32::MAX))
                    .honor_cooldown(false)
                    .send()
            })
            .await
            .map_err(ApiError::into_provider_error)?;
        }
        Ok(())
    }

    /// One group by name, `None` when it does not exist.
    async fn describe_group(&self, name: &str) -> Result<Option<Group>, ProviderError> {
        let resp = self
            .call(
                "DescribeAutoScalingGroups",
                &self.limits.autoscaling,
                || {
                    self.autoscaling
                        .describe_auto_scaling_groups()
                        .auto_scaling_group_names(name)
                        .send()
                },
            )
            .await
            .map_err(ApiError::into_provider_error)?;
        match resp.auto_scaling_groups().first() {
            None => Ok(None),
            Some(g) => {
                let tags = g
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
                    .collect();
                Ok(Some(self.read_group(g, tags).await?))
            }
        }
    }

    fn group_instance(
        &self,
        pool: &AsgPool,
        g: &Group,
        i: &GroupInstance,
        launch_id: &str,
        launched_at_ms: i64,
    ) -> Instance {
        let instance_type = if i.instance_type.is_empty() {
            g.instance_types.first().cloned().unwrap_or_default()
        } else {
            i.instance_type.clone()
        };
        let l = i.lifecycle.as_str();
        let state = if l.starts_with("Pending") || l.starts_with("Warmed") {
            InstanceState::Pending
        } else if i.leaving() && l != "Standby" {
            InstanceState::ShuttingDown
        } else {
            InstanceState::Running
        };
        Instance {
            provider_id: crate::plan::provider_id(&i.zone, &i.id),
            id: i.id.clone(),
            pool: pool.name.clone(),
            launch_id: launch_id.to_string(),
            offering: OfferingKey {
                instance_type,
                zone: i.zone.clone(),
                capacity_type: g.capacity_type,
            },
            state,
            launched_at_ms: if launched_at_ms > 0 {
                launched_at_ms
            } else {
                now_ms()
            },
            reservation_id: None,
            // A group launches from its own template, not ours: no launch of ours to compare.
            launch_fingerprint: None,
            unclaimed: false,
        }
    }

    /// The instances of the pool's groups (their launch time from EC2).
    pub(super) async fn list_groups(&self, pool: &AsgPool) -> Result<Vec<Instance>, ProviderError> {
        self.settle_slow_raises().await;
        let gs = self.pool_groups(pool).await?;
        let ids: Vec<String> = gs
            .iter()
            .flat_map(|g| g.instances.iter().map(|i| i.id.clone()))
            .collect();
        let mut launched_at: BTreeMap<String, i64> = BTreeMap::new();
        for chunk in ids.chunks(200) {
            let resp = self
                .call("DescribeInstances", &self.limits.describe_instances, || {
                    self.client
                        .describe_instances()
                        .filters(
                            Filter::builder()
                                .name("instance-id")
                                .set_values(Some(chunk.to_vec()))
                                .build(),
                        )
                        .send()
                })
                .await
                .map_err(ApiError::into_provider_error)?;
            for i in resp.reservations().iter().flat_map(|r| r.instances()) {
                if let (Some(id), Some(t)) = (i.instance_id(), i.launch_time()) {
                    launched_at.insert(id.to_string(), t.to_millis().unwrap_or(0));
                }
            }
        }
        let launch_of = {
            let state = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            state.launch_of.clone()
        };
        let mut out: Vec<Instance> = gs
            .iter()
            .flat_map(|g| {
                g.instances.iter().map(|i| {
                    self.group_instance(
                        pool,
                        g,
                        i,
                        launch_of.get(&i.id).map(String::as_str).unwrap_or_default(),
                        launched_at.get(&i.id).copied().unwrap_or(0),
                    )
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The group of an instance, if it is in one.
    async fn group_of_instance(&self, id: &str) -> Result<Option<String>, ProviderError> {
        let resp = self
            .call(
                "DescribeAutoScalingInstances",
                &self.limits.autoscaling,
                || {
                    self.autoscaling
                        .describe_auto_scaling_instances()
                        .instance_ids(id)
                        .send()
                },
            )
            .await
            .map_err(ApiError::into_provider_error)?;
        Ok(resp
            .auto_scaling_instances()
            .first()
            .and_then(|i| i.auto_scaling_group_name())
            .map(str::to_string))
    }

    /// Terminates an instance of a group pool's group, decrementing the group's desired
    /// capacity; `Ok(false)` when the instance is in no group (not a group pool's: the caller
    /// goes on as for a `CreateFleet` instance). Refused for an instance of a group that no
    /// pool scales, one protected from scale-in, or one of a group at its minimum size.
    pub(super) async fn terminate_in_group(&self, id: &str) -> Result<bool, ProviderError> {
        if self.config.group_pools.is_empty() {
            return Ok(false);
        }
        let Some(name) = self.group_of_instance(id).await? else {
            return Ok(false);
        };
        let mut ours = None;
        for p in &self.config.group_pools {
            if let Some(g) = self
                .pool_groups(p)
                .await?
                .into_iter()
                .find(|g| g.name == name)
            {
                ours = Some(g);
                break;
            }
        }
        let Some(g) = ours else {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "instance {id} is in Auto Scaling group {name}, which no pool scales: \
                     not terminated"
                ),
            });
        };
        let Some(instance) = g.instances.iter().find(|i| i.id == id) else {
            return Ok(true); // left the group meanwhile
        };
        if instance.leaving() {
            return Ok(true);
        }
        if let Some(why) = groups::refuse_termination(&g, instance) {
            return Err(ProviderError::InvalidRequest { message: why });
        }
        let r = self
            .call(
                "TerminateInstanceInAutoScalingGroup",
                &self.limits.terminate,
                || {
                    self.autoscaling
                        .terminate_instance_in_auto_scaling_group()
                        .instance_id(id)
                        .should_decrement_desired_capacity(true)
                        .send()
                },
            )
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e)
                if e.message.contains("not found")
                    || e.code
                        .as_deref()
                        .is_some_and(|c| crate::errors::GONE_CODES.contains(&c)) =>
            {
                Ok(true)
            }
            Err(e) => Err(e.into_provider_error()),
        }
    }
}

/// How growing one group went.
enum Grown {
    /// Its new instances (fewer than asked when the wait ran out first).
    Launched(Vec<GroupInstance>),
    /// Its scaling activity failed, with this message.
    Failed(String),
}
