//! A real Prometheus (Debian's package, installed by `scripts/prometheus.sh`) on a loopback port,
//! for the end-to-end tests and `anchors`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::free_port;

/// `$GNA_PROMETHEUS_BIN`, else what `scripts/prometheus.sh --print-bin` prints; a missing binary
/// fails loudly with how to install it.
pub fn bin() -> PathBuf {
    let path = crate::tool_path("GNA_PROMETHEUS_BIN", "prometheus.sh", "--print-bin");
    assert!(
        path.is_file(),
        "{} is missing: the GPU-metrics tests and `anchors --hpa real` read through a real \
         Prometheus; install it with `bash scripts/prometheus.sh` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A real Prometheus scraping one target (every second unless told), with its configuration, data
/// and log in a directory of the caller. Stopped on drop.
pub struct Prometheus {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts one scraping every second, its files in `dir`.
    pub fn start(dir: &Path, job: &str, target_port: u16) -> Prometheus {
        Prometheus::start_every(dir, job, target_port, Duration::from_secs(1))
    }

    /// Starts one scraping (and evaluating) every `interval`, its files in `dir`.
    pub fn start_every(dir: &Path, job: &str, target_port: u16, interval: Duration) -> Prometheus {
        let every = format!("{}ms", interval.as_millis().max(1));
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: {every}, evaluation_interval: {every}}}\n\
                 scrape_configs:\n- job_name: {job}\n  static_configs:\n  \
                 - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let mut p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        p.wait_ready(port);
        p
    }

    fn wait_ready(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited ({status}): {}", self.log());
            }
            if http_get(port, "/-/ready").is_some_and(|(code, _)| code == 200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready after 60 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The answer of an instant query (the body of `/api/v1/query`).
    pub fn query(&self, promql: &str) -> String {
        let port: u16 = self.url.rsplit(':').next().unwrap().parse().unwrap();
        let q: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        http_get(port, &format!("/api/v1/query?query={q}"))
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET on loopback (no chunked answer): the status code and the body.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}
