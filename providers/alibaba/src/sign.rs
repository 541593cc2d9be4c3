//! Alibaba Cloud RPC request signing, signature version 1.0 (HMAC-SHA1), and the credentials it
//! uses. Pure functions, tested against the worked example of Alibaba Cloud's documentation.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;

/// Percent-encodes per RFC 3986 as the signature wants it: only `A-Z a-z 0-9 - _ . ~` stay
/// literal, every other UTF-8 byte becomes `%XY` (upper-case hex; a space is `%20`, never `+`).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`percent_encode`] (also accepting `+` as a space, as form encoding does).
/// `None` for a malformed escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `k=v` pairs, each side percent-encoded, sorted by parameter name, joined with `&`. The
/// `Signature` parameter itself must not be in `params`.
pub fn canonicalized_query(params: &BTreeMap<String, String>) -> String {
    // A BTreeMap iterates in byte order of the names, which is the order the signature wants.
    params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `HTTPMethod & percentEncode("/") & percentEncode(canonicalizedQuery)`.
pub fn string_to_sign(method: &str, params: &BTreeMap<String, String>) -> String {
    format!(
        "{method}&{}&{}",
        percent_encode("/"),
        percent_encode(&canonicalized_query(params))
    )
}

/// Base64 of HMAC-SHA1 over the string to sign, keyed with `AccessKeySecret + "&"`.
pub fn signature(
    method: &str,
    params: &BTreeMap<String, String>,
    access_key_secret: &str,
) -> String {
    let key = format!("{access_key_secret}&");
    let mut mac = Hmac::<Sha1>::new_from_slice(key.as_bytes()).expect("HMAC takes any key length");
    mac.update(string_to_sign(method, params).as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The query string of a signed request: the canonicalized query plus `Signature`.
pub fn signed_query(
    method: &str,
    params: &BTreeMap<String, String>,
    access_key_secret: &str,
) -> String {
    let sig = signature(method, params, access_key_secret);
    format!(
        "{}&Signature={}",
        canonicalized_query(params),
        percent_encode(&sig)
    )
}

/// An AccessKey pair, with an STS token when it is temporary. Its `Debug` shows the key id's
/// first characters only, never the secret or the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub access_key_secret: String,
    pub security_token: Option<String>,
}

pub const ENV_ACCESS_KEY_ID: &str = "ALIBABA_CLOUD_ACCESS_KEY_ID";
pub const ENV_ACCESS_KEY_SECRET: &str = "ALIBABA_CLOUD_ACCESS_KEY_SECRET";
pub const ENV_SECURITY_TOKEN: &str = "ALIBABA_CLOUD_SECURITY_TOKEN";

impl Credentials {
    pub fn new(id: impl Into<String>, secret: impl Into<String>) -> Credentials {
        Credentials {
            access_key_id: id.into(),
            access_key_secret: secret.into(),
            security_token: None,
        }
    }

    /// From `ALIBABA_CLOUD_ACCESS_KEY_ID`, `ALIBABA_CLOUD_ACCESS_KEY_SECRET` and, optionally,
    /// `ALIBABA_CLOUD_SECURITY_TOKEN`.
    pub fn from_env() -> Result<Credentials, String> {
        Credentials::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Credentials::from_env`] with another source of variables (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Credentials, String> {
        let non_empty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let missing: Vec<&str> = [ENV_ACCESS_KEY_ID, ENV_ACCESS_KEY_SECRET]
            .into_iter()
            .filter(|k| non_empty(k).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "Alibaba Cloud credentials: {} not set",
                missing.join(" and ")
            ));
        }
        Ok(Credentials {
            access_key_id: non_empty(ENV_ACCESS_KEY_ID).unwrap_or_default(),
            access_key_secret: non_empty(ENV_ACCESS_KEY_SECRET).unwrap_or_default(),
            security_token: non_empty(ENV_SECURITY_TOKEN),
        })
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.access_key_id.chars().take(4).collect();
        f.debug_struct("Credentials")
            .field("access_key_id", &format!("{shown}****"))
            .field("access_key_secret", &"<redacted>")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documented_example() -> BTreeMap<String, String> {
        [
            ("AccessKeyId", "testid"),
            ("Action", "DescribeRegions"),
            ("Format", "XML"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf"),
            ("SignatureVersion", "1.0"),
            ("Timestamp", "2016-02-23T12:46:24Z"),
            ("Version", "2014-05-26"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn documented_example_canonicalized_query() {
        assert_eq!(
            canonicalized_query(&documented_example()),
            "AccessKeyId=testid&Action=DescribeRegions&Format=XML&SignatureMethod=HMAC-SHA1\
             &SignatureNonce=3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf&SignatureVersion=1.0\
             &Timestamp=2016-02-23T12%3A46%3A24Z&Version=2014-05-26"
        );
    }

    #[test]
    fn documented_example_string_to_sign() {
        assert_eq!(
            string_to_sign("GET", &documented_example()),
            "GET&%2F&AccessKeyId%3Dtestid%26Action%3DDescribeRegions%26Format%3DXML\
             %26SignatureMethod%3DHMAC-SHA1%26SignatureNonce%3D3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf\
             %26SignatureVersion%3D1.0%26Timestamp%3D2016-02-23T12%253A46%253A24Z\
             %26Version%3D2014-05-26"
        );
    }

    #[test]
    fn documented_example_signature() {
        assert_eq!(
            signature("GET", &documented_example(), "testsecret"),
            "OLeaidS1JvxuMvnyHOwuJ+uX5qY="
        );
        assert!(signed_query("GET", &documented_example(), "testsecret")
            .ends_with("&Signature=OLeaidS1JvxuMvnyHOwuJ%2BuX5qY%3D"));
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("-_.~azAZ09"), "-_.~azAZ09");
        assert_eq!(percent_encode("a b*c+d/e:f"), "a%20b%2Ac%2Bd%2Fe%3Af");
        assert_eq!(percent_encode("{\"k\":1}"), "%7B%22k%22%3A1%7D");
        assert_eq!(percent_encode("é"), "%C3%A9");
        for s in ["a b*c+d/e:f~", "é{\"x\"}", ""] {
            assert_eq!(percent_decode(&percent_encode(s)).as_deref(), Some(s));
        }
        assert_eq!(percent_decode("%zz"), None);
    }

    #[test]
    fn sorting_is_by_name_not_insertion() {
        let a: BTreeMap<String, String> = [("B", "2"), ("A", "1"), ("a", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(canonicalized_query(&a), "A=1&B=2&a=3");
    }

    #[test]
    fn credentials_from_lookup_and_redacted_debug() {
        let env = |k: &str| match k {
            ENV_ACCESS_KEY_ID => Some("LTAI5tSecretIdXYZ".to_string()),
            ENV_ACCESS_KEY_SECRET => Some("very-secret-value".to_string()),
            ENV_SECURITY_TOKEN => Some("sts-token-value".to_string()),
            _ => None,
        };
        let c = Credentials::from_lookup(env).unwrap();
        assert_eq!(c.security_token.as_deref(), Some("sts-token-value"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("very-secret-value"), "{shown}");
        assert!(!shown.contains("sts-token-value"), "{shown}");
        assert!(!shown.contains("SecretIdXYZ"), "{shown}");
        let err = Credentials::from_lookup(|_| None).unwrap_err();
        assert!(err.contains(ENV_ACCESS_KEY_ID) && err.contains(ENV_ACCESS_KEY_SECRET));
    }
}
