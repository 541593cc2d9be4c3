//! The credential chain against the local fake's STS `AssumeRoleWithOIDC` and ECS metadata
//! service: temporary credentials, their `SecurityToken` on signed calls, refresh before expiry,
//! and no secret in any `Debug`, `Display` or error.

use gpu_node_autoscaler_test_support::ess as support;

use std::time::Duration;

use gpu_node_autoscaler_alibaba::credentials::{
    ChainOverrides, CredentialProvider, CredentialSource, ENV_ECS_METADATA, ENV_IMDSV1_DISABLED,
    ENV_OIDC_PROVIDER_ARN, ENV_OIDC_TOKEN_FILE, ENV_ROLE_ARN, METADATA_TOKEN_HEADER,
};
use gpu_node_autoscaler_alibaba::{AlibabaConfig, AlibabaPool, AlibabaProvider};
use gpu_node_autoscaler_provider::{CapacityType, CloudProvider};
use support::{Fake, ECS_ROLE, METADATA_TOKEN, OIDC_PROVIDER_ARN, OIDC_TOKEN, ROLE_ARN};

fn env(vars: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
    move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
}

fn token_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gna-alibaba-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("token");
    std::fs::write(&p, text).unwrap();
    p
}

fn oidc_source(fake: &Fake, file: &std::path::Path) -> CredentialSource {
    let overrides = ChainOverrides {
        metadata_url: None,
        sts_endpoint: Some(fake.url.clone()),
    };
    CredentialSource::from_lookup(
        env(vec![
            (ENV_ROLE_ARN, ROLE_ARN.into()),
            (ENV_OIDC_PROVIDER_ARN, OIDC_PROVIDER_ARN.into()),
            (ENV_OIDC_TOKEN_FILE, file.display().to_string()),
        ]),
        &overrides,
    )
    .unwrap()
}

fn ecs_source(fake: &Fake, vars: Vec<(&'static str, String)>) -> CredentialSource {
    let overrides = ChainOverrides {
        metadata_url: Some(fake.url.clone()),
        sts_endpoint: None,
    };
    CredentialSource::from_lookup(env(vars), &overrides).unwrap()
}

/// A provider over the fake with one spot pool, signing with `credentials`.
fn provider(fake: &Fake, credentials: CredentialProvider) -> AlibabaProvider {
    let mut config = AlibabaConfig::new("cn-hangzhou");
    config.ess_endpoint = Some(fake.url.clone());
    config.ecs_endpoint = Some(fake.url.clone());
    config.pools.push(AlibabaPool {
        name: "gpu".into(),
        scaling_group: "asg-spot".into(),
        capacity_type: CapacityType::Spot,
        compensate_with_on_demand: false,
        on_demand_group: None,
        instance_types: vec!["ecs.gn7i-c8g1.2xlarge".into()],
        vswitches: [("cn-hangzhou-i".to_string(), "vsw-0".to_string())].into(),
        on_demand_prices: [("ecs.gn7i-c8g1.2xlarge".to_string(), 2.0)].into(),
    });
    AlibabaProvider::new(config, credentials).unwrap()
}

/// The AccessKeyId of every signed call the fake accepted (the fake checked that each carried
/// that key's SecurityToken), in order.
fn signers(fake: &Fake) -> Vec<String> {
    fake.with(|s| s.signed_by.clone())
}

fn assert_clean(fake: &Fake) {
    let v = fake.with(|s| s.violations.clone());
    assert!(v.is_empty(), "the fake saw bad requests: {v:#?}");
}

#[tokio::test]
async fn oidc_credentials_sign_calls_with_their_security_token_and_are_refreshed() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    let file = token_file("oidc", &format!("{OIDC_TOKEN}\n"));
    // Credentials that expire in 100 s, refreshed 180 s before expiry: every call refreshes.
    fake.with(|s| s.temporary_ttl_secs = 100);
    let creds = CredentialProvider::new(oidc_source(&fake, &file));
    let p = provider(&fake, creds);
    p.list("gpu").await.unwrap();
    p.list("gpu").await.unwrap();
    let sts = fake.with(|s| s.sts_calls.clone());
    assert_eq!(sts.len(), 2, "refreshed before expiry");
    assert_eq!(sts[0]["RoleArn"], ROLE_ARN);
    assert_eq!(sts[0]["OIDCProviderArn"], OIDC_PROVIDER_ARN);
    assert_eq!(
        sts[0]["OIDCToken"], OIDC_TOKEN,
        "read from the file, trimmed"
    );
    assert_eq!(sts[0]["DurationSeconds"], "3600");
    assert_eq!(sts[0]["RoleSessionName"], "gpu-node-autoscaler");
    // Each call signed with the credentials of its own refresh.
    let keys = signers(&fake);
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(|k| k.starts_with("STS.")), "{keys:?}");
    assert_ne!(keys[0], keys[1]);
    // Long-lived ones are cached.
    fake.with(|s| s.temporary_ttl_secs = 3600);
    let creds = CredentialProvider::new(oidc_source(&fake, &file));
    let p = provider(&fake, creds);
    for _ in 0..3 {
        p.list("gpu").await.unwrap();
    }
    assert_eq!(fake.with(|s| s.sts_calls.len()), 3);
    let keys = signers(&fake);
    assert!(keys[2..].iter().all(|k| *k == keys[2]), "{keys:?}");
    assert_clean(&fake);
}

#[tokio::test]
async fn oidc_errors_name_the_source_and_code_but_never_the_token() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    let file = token_file("oidc-bad", "not-the-right-oidc-token");
    let creds = CredentialProvider::new(oidc_source(&fake, &file));
    let e = creds.credentials().await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(
        text.contains("AuthenticationFail.OIDCToken.Invalid"),
        "{text}"
    );
    assert!(text.contains(ROLE_ARN), "{text}");
    assert!(!text.contains("not-the-right-oidc-token"), "{text}");
    // Through the provider: the call fails with that cause, nothing is signed.
    let p = provider(&fake, creds);
    let e = p.list("gpu").await.unwrap_err();
    assert!(
        e.to_string()
            .contains("AuthenticationFail.OIDCToken.Invalid"),
        "{e}"
    );
    assert!(fake.with(|s| s.calls.is_empty()));
    let missing =
        CredentialProvider::new(oidc_source(&fake, std::path::Path::new("/nonexistent/t")));
    let e = missing.credentials().await.unwrap_err();
    assert!(e.to_string().contains("/nonexistent/t"), "{e}");
}

#[tokio::test]
async fn ecs_ram_role_in_hardened_mode_asks_the_role_name_then_its_credentials() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    fake.with(|s| s.metadata_hardened_only = true);
    let src = ecs_source(&fake, vec![]);
    let p = provider(&fake, CredentialProvider::new(src));
    p.list("gpu").await.unwrap();
    p.list("gpu").await.unwrap();
    let md = fake.with(|s| s.metadata_requests.clone());
    let paths: Vec<(&str, &str)> = md
        .iter()
        .map(|(m, p, _)| (m.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            ("PUT", "/latest/api/token"),
            ("GET", "/latest/meta-data/ram/security-credentials/"),
            (
                "GET",
                &*format!("/latest/meta-data/ram/security-credentials/{ECS_ROLE}")
            ),
        ],
        "fetched once, then cached"
    );
    assert!(md[1..]
        .iter()
        .all(|(_, _, t)| t.as_deref() == Some(METADATA_TOKEN)));
    let keys = signers(&fake);
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(|k| k.starts_with("ECS.")), "{keys:?}");
    assert_clean(&fake);
    // The header name is the documented one.
    assert_eq!(METADATA_TOKEN_HEADER, "X-aliyun-ecs-metadata-token");
}

#[tokio::test]
async fn ecs_ram_role_falls_back_to_plain_requests_unless_imdsv1_is_disabled() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    fake.with(|s| s.metadata_no_tokens = true);
    let named = ecs_source(&fake, vec![(ENV_ECS_METADATA, ECS_ROLE.into())]);
    let c = CredentialProvider::new(named).credentials().await.unwrap();
    assert!(c.security_token.is_some());
    let md = fake.with(|s| s.metadata_requests.clone());
    assert_eq!(
        md.len(),
        2,
        "token refused, then the named role directly: {md:?}"
    );
    assert_eq!(md[1].2, None);
    let strict = ecs_source(
        &fake,
        vec![
            (ENV_ECS_METADATA, ECS_ROLE.into()),
            (ENV_IMDSV1_DISABLED, "true".into()),
        ],
    );
    let e = CredentialProvider::new(strict)
        .credentials()
        .await
        .unwrap_err();
    assert!(e.to_string().contains(ENV_IMDSV1_DISABLED), "{e}");
    assert_eq!(fake.with(|s| s.metadata_requests.len()), 3);
}

#[tokio::test]
async fn no_secret_in_debug_of_sources_providers_or_fetched_credentials() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    let file = token_file("oidc-debug", OIDC_TOKEN);
    let creds = CredentialProvider::new(oidc_source(&fake, &file));
    let fetched = creds.credentials().await.unwrap();
    let p = provider(&fake, creds);
    p.list("gpu").await.unwrap();
    let shown = format!("{p:?} {fetched:?} {:?}", oidc_source(&fake, &file));
    for secret in [
        fetched.access_key_secret.as_str(),
        fetched.security_token.as_deref().unwrap(),
        OIDC_TOKEN,
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    // The key id shows only its first characters.
    assert!(!shown.contains(&fetched.access_key_id), "{shown}");
    let slow = CredentialProvider::new(ecs_source(&fake, vec![]))
        .with_refresh_before_expiry(Duration::from_secs(1));
    let c = slow.credentials().await.unwrap();
    assert!(!format!("{slow:?}").contains(&c.access_key_secret));
}

#[tokio::test]
async fn concurrent_callers_share_one_refresh() {
    let fake = Fake::start(&[("asg-spot", &["cn-hangzhou-i"])]).await;
    let file = token_file("oidc-concurrent", OIDC_TOKEN);
    let creds = CredentialProvider::new(oidc_source(&fake, &file));
    let (a, b, c, d) = tokio::join!(
        creds.credentials(),
        creds.credentials(),
        creds.credentials(),
        creds.credentials()
    );
    let ids: Vec<String> = [a, b, c, d]
        .into_iter()
        .map(|r| r.unwrap().access_key_id)
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(fake.with(|s| s.sts_calls.len()), 1);
}
