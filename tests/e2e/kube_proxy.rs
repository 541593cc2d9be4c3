//! A fault-injecting relay between the controller and the real kube-apiserver, for what a healthy
//! control plane does not do on demand: API errors (every n-th request answered with an error
//! status) and watches cut (after a time, or all at once). The controller talks plain HTTP to it
//! (its bearer token passes through unchanged); it talks TLS to the API server. Every request is
//! sent upstream with `Connection: close`, so that each connection carries one request and a
//! watch is one connection to cut.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

#[derive(Default)]
struct Faults {
    /// Every n-th request (watches included) fails (0: none).
    error_every: AtomicU32,
    error_code: AtomicU16,
    /// Watches are cut this long after they start (0: never).
    watch_close_after_ms: AtomicU64,
    requests: AtomicU64,
    /// Bumped to cut every open watch.
    cut: tokio::sync::watch::Sender<u64>,
}

pub struct KubeFaultProxy {
    pub addr: SocketAddr,
    faults: Arc<Faults>,
}

impl KubeFaultProxy {
    /// Serves on the runtime `rt` until it ends; `upstream` is the API server's address, `ca` the
    /// CA file its serving certificate is signed by.
    pub fn start(rt: &tokio::runtime::Runtime, upstream: SocketAddr, ca: &Path) -> KubeFaultProxy {
        let roots = {
            let mut store = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).expect("the cluster CA") {
                store.add(cert.expect("a CA certificate")).unwrap();
            }
            store
        };
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        rt.spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(connection(sock, upstream, tls.clone(), f.clone()));
            }
        });
        KubeFaultProxy { addr, faults }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every `every`-th request is answered with `code`; 0 stops the errors.
    pub fn fail_every(&self, every: u32, code: u16) {
        self.faults.error_code.store(code, Ordering::Relaxed);
        self.faults.error_every.store(every, Ordering::Relaxed);
    }

    /// Watches are cut `after` they start (None: never).
    pub fn cut_watches_after(&self, after: Option<Duration>) {
        let ms = after.map_or(0, |d| d.as_millis().max(1) as u64);
        self.faults
            .watch_close_after_ms
            .store(ms, Ordering::Relaxed);
    }

    /// Cuts every open watch now.
    pub fn cut_watches(&self) {
        self.faults.cut.send_modify(|n| *n += 1);
    }
}

fn status_response(code: u16) -> Vec<u8> {
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"injected by the e2e fault proxy","reason":"InternalError","code":{code}}}"#
    );
    format!(
        "HTTP/1.1 {code} Injected\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    faults: Arc<Faults>,
) {
    // The request head (the body, if any, follows in `rest` and on the socket).
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let rest = buf[head_end..].to_vec();
    let target = head.split(' ').nth(1).unwrap_or("");
    let watch = target.contains("watch=true") || target.contains("watch=1");
    let n = faults.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let every = u64::from(faults.error_every.load(Ordering::Relaxed));
    if every > 0 && n.is_multiple_of(every) {
        let code = faults.error_code.load(Ordering::Relaxed);
        let _ = client.write_all(&status_response(code)).await;
        return;
    }
    let Ok(up) = TcpStream::connect(upstream).await else {
        let _ = client.write_all(&status_response(503)).await;
        return;
    };
    let name = ServerName::IpAddress(upstream.ip().into());
    let Ok(mut up) = tls.connect(name, up).await else {
        let _ = client.write_all(&status_response(503)).await;
        return;
    };
    let mut out: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .take_while(|l| !l.is_empty())
        .map(|l| format!("{l}\r\n"))
        .collect();
    out.push_str("Connection: close\r\n\r\n");
    if up.write_all(out.as_bytes()).await.is_err() || up.write_all(&rest).await.is_err() {
        return;
    }
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = tokio::io::split(up);
    let to_upstream = async {
        let _ = tokio::io::copy(&mut cr, &mut uw).await;
        std::future::pending::<()>().await
    };
    let mut cut = faults.cut.subscribe();
    let cut_after = faults.watch_close_after_ms.load(Ordering::Relaxed);
    let closer = async {
        if !watch {
            return std::future::pending::<()>().await;
        }
        let timer = async {
            if cut_after == 0 {
                std::future::pending::<()>().await
            }
            tokio::time::sleep(Duration::from_millis(cut_after)).await
        };
        tokio::select! {
            _ = cut.changed() => {}
            _ = timer => {}
        }
    };
    tokio::select! {
        _ = to_upstream => {}
        _ = tokio::io::copy(&mut ur, &mut cw) => {}
        _ = closer => {}
    }
}
