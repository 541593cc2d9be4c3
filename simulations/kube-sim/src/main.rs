use std::net::SocketAddr;

use clap::Parser;

/// An in-memory, Kubernetes-API-compatible cluster simulator (plain HTTP).
#[derive(Parser, Debug)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Changes kept for watches resuming from a resourceVersion (older ones get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kube-sim: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    eprintln!(
        "kube-sim: serving the Kubernetes API on http://{}",
        args.listen
    );
    let config = kube_sim::Config {
        watch_history: args.watch_history,
        ..kube_sim::Config::default()
    };
    if let Err(e) = kube_sim::serve(listener, config).await {
        eprintln!("kube-sim: {e}");
        std::process::exit(1);
    }
}
