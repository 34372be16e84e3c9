//! Where an S3 store is and how to reach it: `s3://BUCKET/PREFIX`, and the endpoint, credentials and region by the AWS conventions.
//!
//! Resolution, first match wins (as the AWS CLI and SDKs do):
//!
//! * endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
//!   `endpoint_url`; none means AWS itself.
//! * credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+
//!   `AWS_SESSION_TOKEN`); else the profile in the shared credentials file
//!   (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`), then in
//!   the config file (`AWS_CONFIG_FILE`, default `~/.aws/config`). The
//!   profile is `AWS_PROFILE`, else `default`.
//! * region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`,
//!   else `us-east-1`.
//! * addressing: path-style when an endpoint is given (what MinIO, Ceph
//!   RGW, Garage and versitygw expect), virtual-hosted on AWS;
//!   `AWS_S3_ADDRESSING_STYLE=path|virtual` overrides.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;

/// A parsed `s3://BUCKET/PREFIX` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Key prefix under which the store's objects live: empty or ending in `/`.
    pub prefix: String,
}

impl S3Location {
    /// Parses `s3://BUCKET[/PREFIX]`; `None` if `location` is not an S3 URL.
    pub fn parse(location: &str) -> Option<io::Result<S3Location>> {
        let rest = location.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(invalid(format!("{location}: no bucket name"))));
        }
        let prefix = prefix.trim_matches('/');
        Some(Ok(S3Location {
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
        }))
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// How to reach the server: resolved from the environment and the shared files.
#[derive(Clone, Default)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub path_style: bool,
}

impl std::fmt::Debug for S3Config {
    // No secrets in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("path_style", &self.path_style)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    /// Resolves the configuration from this process's environment.
    pub fn from_env() -> io::Result<S3Config> {
        Self::resolve(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// Resolves with `env` standing for the environment (tests pass a map).
    pub fn resolve(env: &dyn Fn(&str) -> Option<String>) -> io::Result<S3Config> {
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, name: &str| {
            env(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        let credentials = read_profile(
            file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            &profile,
            false,
        )?;
        let config = read_profile(file("AWS_CONFIG_FILE", "config"), &profile, true)?;
        let from_files = |key: &str| credentials.get(key).or(config.get(key)).cloned();
        let (access_key_id, secret_access_key, session_token) =
            match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(id), Some(secret)) => (Some(id), Some(secret), env("AWS_SESSION_TOKEN")),
                _ => (
                    from_files("aws_access_key_id"),
                    from_files("aws_secret_access_key"),
                    from_files("aws_session_token"),
                ),
            };
        let endpoint = env("AWS_ENDPOINT_URL_S3")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| config.get("endpoint_url").cloned());
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| config.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".into());
        let path_style = match env("AWS_S3_ADDRESSING_STYLE").as_deref() {
            Some("path") => true,
            Some("virtual") => false,
            Some(other) => {
                return Err(invalid(format!(
                    "AWS_S3_ADDRESSING_STYLE={other}: expected path or virtual"
                )))
            }
            None => endpoint.is_some(),
        };
        Ok(S3Config {
            endpoint,
            region,
            access_key_id,
            secret_access_key,
            session_token,
            path_style,
        })
    }
}

/// The keys of one profile of an AWS INI file (`[NAME]` in the credentials
/// file, `[profile NAME]` or `[default]` in the config file); empty when
/// the file does not exist.
fn read_profile(
    path: Option<PathBuf>,
    profile: &str,
    config_file: bool,
) -> io::Result<HashMap<String, String>> {
    let Some(path) = path else {
        return Ok(HashMap::new());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", path.display()),
            ))
        }
    };
    let wanted = if config_file && profile != "default" {
        format!("profile {profile}")
    } else {
        profile.to_string()
    };
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == wanted;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    Ok(out)
}

pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        let l = S3Location::parse("s3://bucket/a/b/").unwrap().unwrap();
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("bucket", "a/b/"));
        let l = S3Location::parse("s3://bucket").unwrap().unwrap();
        assert_eq!(l.prefix, "");
        assert!(S3Location::parse("s3:///x").unwrap().is_err());
        assert!(S3Location::parse("/srv/store").is_none());
    }

    #[test]
    fn environment_wins_then_profile_files() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n[work]\naws_access_key_id=WORK\naws_secret_access_key=worksecret\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[default]\nregion = eu-west-1\n[profile work]\nregion = eu-north-1\nendpoint_url = http://127.0.0.1:9000\n",
        )
        .unwrap();
        let base: Vec<(&str, String)> = vec![
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            ("AWS_CONFIG_FILE", config.display().to_string()),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut map: HashMap<String, String> = base
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            for (k, v) in extra {
                map.insert(k.to_string(), v.to_string());
            }
            S3Config::resolve(&move |k| map.get(k).cloned()).unwrap()
        };
        let c = with(&[]);
        assert_eq!(c.access_key_id.as_deref(), Some("DEF"));
        assert_eq!(
            (c.region.as_str(), c.endpoint.clone(), c.path_style),
            ("eu-west-1", None, false)
        );
        let c = with(&[("AWS_PROFILE", "work")]);
        assert_eq!(c.access_key_id.as_deref(), Some("WORK"));
        assert_eq!(c.region, "eu-north-1");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(c.path_style);
        let c = with(&[
            ("AWS_PROFILE", "work"),
            ("AWS_ACCESS_KEY_ID", "ENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_REGION", "ap-south-1"),
            ("AWS_ENDPOINT_URL_S3", "http://[::1]:7070"),
            ("AWS_S3_ADDRESSING_STYLE", "virtual"),
        ]);
        assert_eq!(c.access_key_id.as_deref(), Some("ENV"));
        assert_eq!(c.region, "ap-south-1");
        assert_eq!(c.endpoint.as_deref(), Some("http://[::1]:7070"));
        assert!(!c.path_style);
        assert!(!format!("{c:?}").contains("envsecret"));
    }
}
