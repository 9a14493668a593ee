//! A fault-injecting TCP proxy for the reliability suites.
//!
//! Listens on a loopback port and forwards every connection to the MongoDB server. On command it
//! passes traffic, delays it, blackholes it (connections stay open, nothing is forwarded, new
//! ones are accepted and stalled too) or refuses it (every connection is closed at once, new
//! ones are closed on accept). `cut_connections` closes what is open without changing the mode.
//!
//! The lock under test connects through the proxy (`ProxiedClient`); assertions use a control
//! client that talks to the server directly.

use std::net::SocketAddr;
use std::time::Duration;

use mongodb::Client;
use mongodb::options::{ClientOptions, ServerAddress};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward everything after this delay in each direction (round trip: twice this).
    Latency(Duration),
    /// Keep connections open and forward nothing.
    Blackhole,
    /// Close every connection, now and on accept.
    Refuse,
}

#[derive(Clone, Copy, Debug)]
struct State {
    fault: Fault,
    /// Bumped by `cut_connections`: connections opened before the bump close.
    generation: u64,
}

pub struct FaultProxy {
    address: SocketAddr,
    state: watch::Sender<State>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on the current runtime; it stops with the runtime.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("local address");
        let (state, _) = watch::channel(State {
            fault: Fault::Pass,
            generation: 0,
        });
        let states = state.subscribe();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let states = states.clone();
                if states.borrow().fault == Fault::Refuse {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, upstream, states));
            }
        });
        FaultProxy { address, state }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn set(&self, fault: Fault) {
        self.state.send_modify(|state| state.fault = fault);
    }

    /// Closes every open connection (their unforwarded bytes are discarded).
    pub fn cut_connections(&self) {
        self.state.send_modify(|state| state.generation += 1);
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, mut states: watch::Receiver<State>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let generation = states.borrow().generation;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (upward, downward) = (states.clone(), states.clone());
    let closed = async move {
        let _ = states
            .wait_for(|state| state.generation != generation || state.fault == Fault::Refuse)
            .await;
    };
    // Whichever ends first ends the connection; dropping the halves closes both sockets.
    tokio::select! {
        () = pump(client_read, server_write, upward) => {}
        () = pump(server_read, client_write, downward) => {}
        () = closed => {}
    }
}

/// Copies one direction, applying latency and blackholing.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, states: watch::Receiver<State>) {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut reader_states = states.clone();
    let reader = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            if reader_states
                .wait_for(|s| s.fault != Fault::Blackhole)
                .await
                .is_err()
            {
                return;
            }
            let read = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let delay = match reader_states.borrow().fault {
                Fault::Latency(delay) => delay,
                _ => Duration::ZERO,
            };
            if chunks
                .send((Instant::now() + delay, buffer[..read].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let mut writer_states = states;
    let writer = async move {
        while let Some((due, chunk)) = pending.recv().await {
            tokio::time::sleep_until(due).await;
            if writer_states
                .wait_for(|s| s.fault != Fault::Blackhole)
                .await
                .is_err()
            {
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}

/// The server's address, from the test server's URI (a single host).
pub async fn upstream_address() -> SocketAddr {
    let options = ClientOptions::parse(super::server::uri())
        .await
        .expect("valid MongoDB URI");
    let Some(ServerAddress::Tcp { host, port }) = options.hosts.first().cloned() else {
        panic!(
            "the fault proxy needs a single-host MongoDB URI, got {:?}",
            options.hosts
        );
    };
    tokio::net::lookup_host((host.as_str(), port.unwrap_or(27017)))
        .await
        .expect("resolve the MongoDB host")
        .next()
        .expect("an address for the MongoDB host")
}

/// A proxy to the test server and a client that connects through it (directly, no discovery),
/// with short timeouts so a refused server is noticed quickly.
pub async fn proxied_client() -> (FaultProxy, Client) {
    let proxy = FaultProxy::start(upstream_address().await).await;
    let mut options = ClientOptions::parse(super::server::uri())
        .await
        .expect("valid MongoDB URI");
    options.hosts = vec![ServerAddress::Tcp {
        host: proxy.address().ip().to_string(),
        port: Some(proxy.address().port()),
    }];
    options.direct_connection = Some(true);
    options.repl_set_name = None;
    options.server_selection_timeout = Some(Duration::from_secs(5));
    options.connect_timeout = Some(Duration::from_secs(2));
    let client = Client::with_options(options).expect("valid client options");
    (proxy, client)
}
