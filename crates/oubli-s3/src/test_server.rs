//! A real S3 server for the tests: versitygw (posix backend, versioning on) — or MinIO with `OUBLI_S3_SERVER=minio` — started on loopback in a directory of the caller's.
//!
//! scripts/test installs versitygw (`go install
//! github.com/versity/versitygw/cmd/versitygw@v1.8.0`); where it is missing,
//! [`TestServer::start`] returns `None` and the caller skips, saying so.
//! MinIO (`go install github.com/minio/minio@latest`) runs with four drives
//! (erasure coding, which its versioning needs).

use crate::admin::Admin;
use crate::config::{S3Config, S3Location};
use std::io;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ACCESS_KEY: &str = "oubli-test";
const SECRET_KEY: &str = "oubli-test-secret-key";

/// A versitygw process; killed on drop.
pub struct TestServer {
    child: Child,
    binary: PathBuf,
    port: u16,
    /// Where the current objects live (one directory per bucket).
    pub data: PathBuf,
    /// Where the server keeps every older version.
    pub versions: PathBuf,
}

/// Which server the tests run: `OUBLI_S3_SERVER` (`versitygw`, the
/// default, or `minio`).
fn server_name() -> String {
    std::env::var("OUBLI_S3_SERVER").unwrap_or_else(|_| "versitygw".into())
}

/// The versitygw binary: `$OUBLI_VERSITYGW`, on `PATH`, or in Go's bin directory.
pub fn versitygw() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OUBLI_VERSITYGW") {
        return Some(PathBuf::from(p));
    }
    find_binary(&server_name())
}

fn find_binary(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(gopath) = std::env::var_os("GOPATH") {
        dirs.push(PathBuf::from(gopath).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join("go/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

impl TestServer {
    /// Starts a server keeping its data under `dir`; `None` without versitygw.
    /// With `OUBLI_REQUIRE_S3` set (scripts/test sets it once it has
    /// installed versitygw), a missing server is a failure, not a skip.
    pub fn start(dir: &Path) -> Option<TestServer> {
        let Some(binary) = versitygw() else {
            assert!(
                std::env::var_os("OUBLI_REQUIRE_S3").is_none(),
                "OUBLI_REQUIRE_S3 is set but versitygw is not installed"
            );
            return None;
        };
        let data = dir.join("s3-data");
        let versions = dir.join("s3-versions");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&versions).unwrap();
        // A port picked free may be taken again before versitygw binds it
        // (tests run in parallel): then it exits, and another port is tried.
        for _ in 0..10 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap()
                .port();
            let child = spawn(&binary, port, &data, &versions).unwrap();
            let mut server = TestServer {
                child,
                binary: binary.clone(),
                port,
                data: data.clone(),
                versions: versions.clone(),
            };
            if server.wait_ready() {
                return Some(server);
            }
            server.kill();
        }
        panic!("versitygw did not start on any of 10 ports");
    }

    /// Whether our process came up listening (not another's on the same port).
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // Still ours a moment later: a loser of a port race exits at once.
                std::thread::sleep(Duration::from_millis(100));
                return matches!(self.child.try_wait(), Ok(None));
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`start`](Self::start), saying on stderr why the calling test skips
    /// when there is no server.
    pub fn start_or_skip(dir: &Path) -> Option<TestServer> {
        let server = Self::start(dir);
        if server.is_none() {
            eprintln!("skipped: versitygw is not installed (scripts/test installs it)");
        }
        server
    }

    /// Kills the server (kill -9) — what a crash of the cloud side looks like.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.binary, self.port, &self.data, &self.versions).unwrap();
        assert!(self.wait_ready(), "versitygw did not restart");
    }

    /// How to reach it.
    pub fn config(&self) -> S3Config {
        S3Config {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: "us-east-1".into(),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
            session_token: None,
            path_style: true,
        }
    }

    /// The same as environment variables, for a child `oubli` process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    pub fn admin(&self) -> Admin {
        Admin::new(&self.config()).unwrap()
    }

    /// Makes a bucket (versioned or not) and returns `s3://name/prefix`.
    pub fn bucket(&self, name: &str, versioned: bool, prefix: &str) -> S3Location {
        let admin = self.admin();
        // A server may listen before it serves (MinIO formats its drives first).
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = admin.create_bucket(name) {
            assert!(Instant::now() < deadline, "creating bucket {name}: {e}");
            std::thread::sleep(Duration::from_millis(200));
        }
        if versioned {
            admin.enable_versioning(name).unwrap();
        }
        S3Location::parse(&format!("s3://{name}/{prefix}"))
            .unwrap()
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(binary: &Path, port: u16, data: &Path, versions: &Path) -> io::Result<Child> {
    if server_name() == "minio" {
        let drives: Vec<PathBuf> = (1..=4).map(|i| data.join(format!("drive{i}"))).collect();
        for d in &drives {
            std::fs::create_dir_all(d)?;
        }
        return Command::new(binary)
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            // The test drives are directories on the root file system.
            .env("MINIO_CI_CD", "1")
            .arg("server")
            .arg("--quiet")
            .arg("--address")
            .arg(format!("127.0.0.1:{port}"))
            .args(&drives)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
    Command::new(binary)
        .env("ROOT_ACCESS_KEY", ACCESS_KEY)
        .env("ROOT_SECRET_KEY", SECRET_KEY)
        .arg("--port")
        .arg(format!("127.0.0.1:{port}"))
        .arg("posix")
        .arg("--versioning-dir")
        .arg(versions)
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}
