//! Shared helpers: an in-process kube-sim, a tiny HTTP/1.1 client, and a `kubectl` runner.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

/// A server with the API only (no scheduler, no kubelets): pods stay as the test leaves them.
pub fn start() -> SocketAddr {
    start_with(kube_sim::Config::api_only())
}

/// Polls `f` every 50 ms until it returns Some, for at most `secs` seconds; panics with `what`.
pub fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn start_with(config: kube_sim::Config) -> SocketAddr {
    let addr = kube_sim::spawn_background(config).expect("start kube-sim");
    // The listener is bound before spawn_background returns, so the server accepts right away.
    addr
}

/// A loopback port nothing listens on (for servers started as child processes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to kube-sim");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn send(s: &mut TcpStream, method: &str, path: &str, content_type: &str, body: &[u8]) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: kube-sim\r\nAccept: application/json\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
}

/// Reads the status line and headers; returns (status, chunked).
fn read_head(r: &mut impl BufRead) -> (u16, bool) {
    let (status, headers) = read_head_full(r);
    (status, is_chunked(&headers))
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"))
}

/// Reads the status line and headers (names lowercased).
fn read_head_full(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .expect("status")
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim(), 16).ok()?;
    let mut buf = vec![0; size + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(size);
    (size > 0).then_some(buf)
}

/// One request; returns the status code and the JSON body (Null if not JSON).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let (status, _, body) = request_full(addr, method, path, content_type, body);
    (status, body)
}

/// One request; returns the status code, the headers (names lowercased) and the JSON body.
pub fn request_full(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, Value) {
    let mut s = connect(addr);
    send(&mut s, method, path, content_type, body.as_bytes());
    let mut r = BufReader::new(s);
    let (status, headers) = read_head_full(&mut r);
    let mut bytes = Vec::new();
    if is_chunked(&headers) {
        while let Some(c) = read_chunk(&mut r) {
            bytes.extend(c);
        }
    } else {
        r.read_to_end(&mut bytes).unwrap();
    }
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    request(addr, "GET", path, "application/json", "")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    request(addr, "POST", path, "application/json", &body.to_string())
}

pub fn put(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    request(addr, "PUT", path, "application/json", &body.to_string())
}

pub fn patch(addr: SocketAddr, path: &str, content_type: &str, body: &Value) -> (u16, Value) {
    request(addr, "PATCH", path, content_type, &body.to_string())
}

/// A streaming watch: newline-delimited JSON events out of a chunked response.
pub struct Watch {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
    pub status: u16,
}

impl Watch {
    pub fn open(addr: SocketAddr, path: &str) -> Watch {
        let mut s = connect(addr);
        send(&mut s, "GET", path, "application/json", b"");
        let mut reader = BufReader::new(s);
        let (status, chunked) = read_head(&mut reader);
        assert!(chunked, "a watch answers with a chunked stream");
        Watch {
            reader,
            pending: Vec::new(),
            status,
        }
    }

    /// Reads events until the stream ends: true when the server ended it (the last chunk), false
    /// when reading failed first (e.g. the 10 s read timeout).
    pub fn ends(&mut self) -> bool {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).unwrap_or(0) == 0 {
                return false;
            }
            let Ok(size) = usize::from_str_radix(line.trim(), 16) else {
                return false;
            };
            let mut buf = vec![0; size + 2];
            if self.reader.read_exact(&mut buf).is_err() {
                return false;
            }
            if size == 0 {
                return true;
            }
        }
    }

    /// The object of the next event of type `kind` (others are skipped); panics when the stream
    /// ends first.
    pub fn next_of(&mut self, kind: &str) -> Value {
        loop {
            let ev = self.next().expect("the watch is open");
            if ev["type"] == kind {
                return ev["object"].clone();
            }
        }
    }

    /// The next event, or None when the server ended the stream.
    pub fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("a JSON watch event"));
            }
            let chunk = read_chunk(&mut self.reader)?;
            self.pending.extend(chunk);
        }
    }
}

/// Runs the machine's real kubectl against the server; panics (fails) if kubectl is missing.
pub struct Kubectl {
    server: String,
    cache: PathBuf,
}

impl Kubectl {
    pub fn new(addr: SocketAddr) -> Kubectl {
        let cache = std::env::temp_dir().join(format!(
            "kube-sim-test-cache-{}-{}",
            std::process::id(),
            addr.port()
        ));
        Kubectl {
            server: format!("http://{addr}"),
            cache,
        }
    }

    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.args(["--server", &self.server, "--cache-dir"])
            .arg(&self.cache)
            .args(["--request-timeout", "20s"])
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("the real kubectl must be installed on PATH for these tests");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().unwrap()
    }

    /// Runs kubectl and asserts success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_stdin(args, None)
    }

    pub fn ok_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Runs kubectl and asserts failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(
            !out.status.success(),
            "kubectl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// `create -f -` of a YAML document stream.
    pub fn create(&self, yaml: &str) -> String {
        self.ok_stdin(&["create", "-f", "-"], Some(yaml))
    }
}
