//! A dcgm-exporter stand-in whose exposition a test rewrites (the GPUs of a node reporting an
//! XID), scraped by the real Prometheus of the test support.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_node_autoscaler_test_support::hpa::serve_exposition;
pub use gpu_node_autoscaler_test_support::prometheus::Prometheus;

/// Serves `/metrics` from a text the test may change at any time.
pub struct Exporter {
    pub port: u16,
    pub body: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
}

impl Exporter {
    pub fn start(body: String) -> Exporter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let body = Arc::new(Mutex::new(body));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (body.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let text = b.lock().unwrap().clone();
                        let _ = serve_exposition(conn, &text);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Exporter { port, body, stop }
    }

    pub fn set(&self, body: String) {
        *self.body.lock().unwrap() = body;
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
