//! XID errors of GPUs read from a Prometheus that scrapes dcgm-exporter (`gpuMetrics` in the
//! policy): one instant query of `DCGM_FI_DEV_XID_ERRORS`, the last XID each GPU reported.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_node_autoscaler_core::model::node::GpuXid;
use gpu_node_autoscaler_core::policy::GpuMetrics;
use serde::Deserialize;

/// dcgm-exporter's gauge: the value of the last XID error a GPU reported (0 for none).
pub const XID_METRIC: &str = "DCGM_FI_DEV_XID_ERRORS";

/// The PromQL query: every GPU whose last XID is not 0.
pub fn query(cfg: &GpuMetrics) -> String {
    if cfg.selector.is_empty() {
        format!("{XID_METRIC} != 0")
    } else {
        format!("{XID_METRIC}{{{}}} != 0", cfg.selector)
    }
}

/// Reads the XIDs per Node name.
pub async fn read(
    http: &reqwest::Client,
    cfg: &GpuMetrics,
) -> Result<BTreeMap<String, Vec<GpuXid>>, String> {
    let url = format!("{}/api/v1/query", cfg.prometheus_url);
    let resp = http
        .get(&url)
        .query(&[("query", query(cfg))])
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("querying {url}: {e}"))?;
    let status = resp.status();
    let body = resp
        .text()
        .await
        .map_err(|e| format!("reading the answer of {url}: {e}"))?;
    // Prometheus answers errors (a bad query: 400, a timeout: 503) with the same JSON shape.
    parse(&body, &cfg.node_label).map_err(|e| format!("{url} answered {status}: {e}"))
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<Sample>,
}

#[derive(Deserialize)]
struct Sample {
    metric: BTreeMap<String, String>,
    /// `[unix time, "value"]`.
    value: (f64, String),
}

/// The XIDs per Node name in an instant query's answer. Series without the node label, or
/// with a value that is no XID, are left out (they cannot be placed on a node).
pub fn parse(body: &str, node_label: &str) -> Result<BTreeMap<String, Vec<GpuXid>>, String> {
    let a: Answer = serde_json::from_str(body).map_err(|e| {
        let head: String = body.chars().take(200).collect();
        format!("not a Prometheus API answer ({e}): {head:?}")
    })?;
    if a.status != "success" {
        return Err(a.error.unwrap_or_else(|| format!("status {:?}", a.status)));
    }
    let data = a.data.ok_or("an answer without data")?;
    if data.result_type != "vector" {
        return Err(format!(
            "an answer of type {:?}, not an instant vector",
            data.result_type
        ));
    }
    let mut out: BTreeMap<String, Vec<GpuXid>> = BTreeMap::new();
    for s in data.result {
        let Some(node) = s.metric.get(node_label) else {
            continue;
        };
        let Ok(v) = s.value.1.parse::<f64>() else {
            continue;
        };
        if !(v >= 1.0 && v <= f64::from(u32::MAX) && v.fract() == 0.0) {
            continue;
        }
        let x = GpuXid {
            gpu: s.metric.get("gpu").cloned().unwrap_or_default(),
            xid: v as u32,
        };
        let list = out.entry(node.clone()).or_default();
        if !list.contains(&x) {
            list.push(x);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gives_each_nodes_gpus_and_their_last_xid() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"3","UUID":"GPU-1","Hostname":"ip-10-0-1-7.ec2.internal","err_code":"79"},"value":[1764000000.5,"79"]},
          {"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"3","UUID":"GPU-1","Hostname":"ip-10-0-1-7.ec2.internal","job":"other"},"value":[1764000000.5,"79"]},
          {"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"0","Hostname":"ip-10-0-2-9.ec2.internal"},"value":[1764000000.5,"13"]},
          {"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"1"},"value":[1764000000.5,"48"]},
          {"metric":{"__name__":"DCGM_FI_DEV_XID_ERRORS","gpu":"2","Hostname":"n"},"value":[1764000000.5,"NaN"]}
        ]}}"#;
        let got = parse(body, "Hostname").unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got["ip-10-0-1-7.ec2.internal"],
            [GpuXid {
                gpu: "3".into(),
                xid: 79
            }],
            "duplicate series count once"
        );
        assert_eq!(got["ip-10-0-2-9.ec2.internal"][0].xid, 13);
        assert!(parse(body, "node").unwrap().is_empty());
    }

    #[test]
    fn an_error_answer_or_a_foreign_body_is_an_error_that_says_why() {
        let e = parse(
            r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:24: parse error"}"#,
            "Hostname",
        )
        .unwrap_err();
        assert!(e.contains("parse error"), "{e}");
        let e = parse("<html>502 Bad Gateway</html>", "Hostname").unwrap_err();
        assert!(e.contains("not a Prometheus API answer"), "{e}");
        let e = parse(
            r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
            "Hostname",
        )
        .unwrap_err();
        assert!(e.contains("matrix"), "{e}");
    }

    #[test]
    fn the_query_carries_the_selector() {
        let mut cfg = GpuMetrics {
            prometheus_url: "http://p:9090".into(),
            selector: String::new(),
            node_label: "Hostname".into(),
            interval: Duration::from_secs(30),
        };
        assert_eq!(query(&cfg), "DCGM_FI_DEV_XID_ERRORS != 0");
        cfg.selector = r#"job="dcgm-exporter""#.into();
        assert_eq!(
            query(&cfg),
            r#"DCGM_FI_DEV_XID_ERRORS{job="dcgm-exporter"} != 0"#
        );
    }
}
