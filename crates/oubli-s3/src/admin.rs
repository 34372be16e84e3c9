//! Bucket-level S3 requests object_store does not offer (create a bucket, turn versioning on, list and fetch every version of an object), signed by object_store's own SigV4 signer.
//!
//! The tests use them to prepare a bucket and to act as the adversary who
//! keeps every version ([`Admin::history`], which `oubli audit
//! --with-versions` uses too); `versions` also serves purging old versions,
//! and [`Admin::get_dated`] gives the lease its server-clock age of the lock.

use crate::config::{S3Config, S3Location};
use bytes::Bytes;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{
    HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
};
use object_store::ClientOptions;
use std::io;

/// One version of one object in a versioned bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub key: String,
    pub version_id: String,
    /// A delete marker holds no data.
    pub delete_marker: bool,
    /// The object's current version (a current delete marker: the object is deleted).
    pub is_latest: bool,
}

/// Everything a bucket kept of one store: what the provider, its replicas
/// and its backups hold.
#[derive(Default)]
pub struct History {
    /// Every segment byte any version of any run or pack holds, as
    /// `(segment, offset, bytes)` (runs are written once: the versions of
    /// one segment never disagree).
    pub pieces: Vec<(oubli_core::SegmentId, u64, Vec<u8>)>,
    /// Every slot of every version of the superblocks object, each once.
    pub superblocks: Vec<Vec<u8>>,
    /// Object versions read (delete markers not counted).
    pub versions: usize,
}

/// An object read with the server's dates ([`Admin::get_dated`]).
pub struct Dated {
    pub body: Bytes,
    pub etag: Option<String>,
    /// How long ago the server last wrote it, by the server's clock.
    pub age: Option<std::time::Duration>,
}

/// Signed requests against one endpoint (path-style).
pub struct Admin {
    runtime: tokio::runtime::Runtime,
    client: HttpClient,
    endpoint: String,
    region: String,
    credential: AwsCredential,
}

impl Admin {
    pub fn new(config: &S3Config) -> io::Result<Admin> {
        // AWS itself when no endpoint is named (path-style works there too).
        let endpoint = config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", config.region));
        let credential = AwsCredential {
            key_id: config.access_key_id.clone().unwrap_or_default(),
            secret_key: config.secret_access_key.clone().unwrap_or_default(),
            token: config.session_token.clone(),
        };
        let options = ClientOptions::new().with_allow_http(endpoint.starts_with("http://"));
        let client = ReqwestConnector::default()
            .connect(&options)
            .map_err(io::Error::other)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Admin {
            runtime,
            client,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            region: config.region.clone(),
            credential,
        })
    }

    /// Sends a signed request; returns the body of a 2xx answer.
    fn send(&self, method: &str, path_and_query: &str, body: Bytes) -> io::Result<Bytes> {
        self.send_full(method, path_and_query, body)
            .map(|(_, body)| body)
    }

    /// Reads the object `key` with the server's dates: its body, ETag and
    /// age — the answer's `Date` less the object's `Last-Modified`, both
    /// the server's clock (`None` when the server gives either no date).
    /// `None` when there is no such object.
    pub fn get_dated(&self, bucket: &str, key: &str) -> io::Result<Option<Dated>> {
        let path = format!("/{bucket}/{}", encode_key(key));
        let (headers, body) = match self.send_full("GET", &path, Bytes::new()) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let date = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| chrono::DateTime::parse_from_rfc2822(v).ok())
        };
        let age = match (date("date"), date("last-modified")) {
            (Some(now), Some(modified)) => Some(
                (now - modified)
                    .to_std()
                    .unwrap_or(std::time::Duration::ZERO),
            ),
            _ => None,
        };
        let etag = headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok(Some(Dated { body, etag, age }))
    }

    /// Sends a signed request; returns the headers and body of a 2xx
    /// answer (a 404 is a `NotFound` error).
    fn send_full(
        &self,
        method: &str,
        path_and_query: &str,
        body: Bytes,
    ) -> io::Result<(http::HeaderMap, Bytes)> {
        let mut request: HttpRequest = http::Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.endpoint))
            .body(HttpRequestBody::from(body))
            .map_err(io::Error::other)?;
        AwsAuthorizer::new(&self.credential, "s3", &self.region).authorize(&mut request, None);
        self.runtime.block_on(async {
            let response = self
                .client
                .execute(request)
                .await
                .map_err(io::Error::other)?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .bytes()
                .await
                .map_err(io::Error::other)?;
            if status.is_success() {
                Ok((headers, body))
            } else {
                let kind = if status == http::StatusCode::NOT_FOUND {
                    io::ErrorKind::NotFound
                } else {
                    io::ErrorKind::Other
                };
                Err(io::Error::new(
                    kind,
                    format!(
                        "{method} {path_and_query}: {status}: {}",
                        String::from_utf8_lossy(&body)
                    ),
                ))
            }
        })
    }

    /// Creates `bucket` (an existing one owned by us is fine).
    pub fn create_bucket(&self, bucket: &str) -> io::Result<()> {
        match self.send("PUT", &format!("/{bucket}"), Bytes::new()) {
            Err(e) if e.to_string().contains("BucketAlreadyOwnedByYou") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Turns versioning on: from now on the server keeps every version.
    pub fn enable_versioning(&self, bucket: &str) -> io::Result<()> {
        let body = "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Status>Enabled</Status></VersioningConfiguration>";
        self.send("PUT", &format!("/{bucket}?versioning"), Bytes::from(body))
            .map(|_| ())
    }

    /// Every version (and delete marker) of every object under `prefix`.
    pub fn versions(&self, bucket: &str, prefix: &str) -> io::Result<Vec<ObjectVersion>> {
        let mut out = Vec::new();
        let mut marker: Option<(String, String)> = None;
        loop {
            let mut query = format!("/{bucket}?versions&prefix={}", encode(prefix));
            if let Some((key, version)) = &marker {
                query.push_str(&format!(
                    "&key-marker={}&version-id-marker={}",
                    encode(key),
                    encode(version)
                ));
            }
            let body = self.send("GET", &query, Bytes::new())?;
            let text = String::from_utf8_lossy(&body);
            for (tag, delete_marker) in [("Version", false), ("DeleteMarker", true)] {
                for block in elements(&text, tag) {
                    out.push(ObjectVersion {
                        key: unescape(element(block, "Key").unwrap_or_default()),
                        version_id: element(block, "VersionId").unwrap_or_default().to_string(),
                        delete_marker,
                        is_latest: element(block, "IsLatest") == Some("true"),
                    });
                }
            }
            if element(&text, "IsTruncated") != Some("true") {
                break;
            }
            marker = Some((
                unescape(element(&text, "NextKeyMarker").unwrap_or_default()),
                element(&text, "NextVersionIdMarker")
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
        Ok(out)
    }

    /// Reads every version of every object of the store at `at` (on a
    /// bucket without versioning: its current objects).
    pub fn history(&self, at: &S3Location) -> io::Result<History> {
        let mut history = History::default();
        for v in self.versions(&at.bucket, &at.prefix)? {
            if v.delete_marker {
                continue;
            }
            let Some(name) = v.key.strip_prefix(at.prefix.as_str()) else {
                continue;
            };
            let bytes = self.get_version(&at.bucket, &v.key, &v.version_id)?;
            history.versions += 1;
            if name == "superblocks" {
                let slots = crate::decode_superblocks(&bytes).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{at}: a version of the superblocks object is malformed"),
                    )
                })?;
                history.superblocks.extend(slots.into_iter().flatten());
            } else {
                for (id, offset, piece) in crate::layout::pieces_of(name, &bytes) {
                    history.pieces.push((id, offset, piece.to_vec()));
                }
            }
        }
        history.superblocks.sort();
        history.superblocks.dedup();
        Ok(history)
    }

    /// The bytes of one version of an object.
    pub fn get_version(&self, bucket: &str, key: &str, version_id: &str) -> io::Result<Vec<u8>> {
        let path = format!(
            "/{bucket}/{}?versionId={}",
            encode_key(key),
            encode(version_id)
        );
        self.send("GET", &path, Bytes::new()).map(|b| b.to_vec())
    }

    /// Removes one version for good (purging what a versioned bucket keeps).
    pub fn delete_version(&self, bucket: &str, key: &str, version_id: &str) -> io::Result<()> {
        let path = format!(
            "/{bucket}/{}?versionId={}",
            encode_key(key),
            encode(version_id)
        );
        self.send("DELETE", &path, Bytes::new()).map(|_| ())
    }
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Percent-encodes an object key, keeping its slashes.
fn encode_key(key: &str) -> String {
    key.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// The contents of every `<tag>...</tag>` in `xml`.
fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    elements(xml, tag).into_iter().next()
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}
