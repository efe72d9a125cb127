//! Leader election against a real kube-apiserver, reached through a TCP relay that the test can cut: a leader
//! that loses the API server stops leading before its Lease can pass to another replica, so two replicas never
//! lead at once; when the API server is back and the other replica leaves, it leads again.
//!
//! Runs only when `ISTHMUS_TEST_KUBECONFIG` names a control plane's kubeconfig (`make operator-it` starts one);
//! without it the test says so and passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use isthmus_operator::leader::{Election, LeaderConfig};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

async fn config() -> Option<kube::Config> {
    let path = std::env::var("ISTHMUS_TEST_KUBECONFIG").ok()?;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("readable kubeconfig");
    Some(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("usable kubeconfig"))
}

/// Forwards connections to the API server until cut; once cut, every open connection is dropped and new ones
/// are accepted and left hanging, as in a network partition.
struct Relay {
    url: http::Uri,
    cut: Arc<AtomicBool>,
    cut_now: watch::Sender<bool>,
}

impl Relay {
    async fn start(upstream: &http::Uri) -> Relay {
        let host = upstream.host().expect("API server URL with a host").trim_matches(['[', ']']).to_owned();
        let upstream_addr = format!("{}:{}", upstream.host().unwrap(), upstream.port_u16().unwrap_or(443));
        // Same host as the API server, so its certificate's IP SAN still matches.
        let listener = TcpListener::bind((host.as_str(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url: http::Uri = format!("https://{}:{port}", upstream.host().unwrap()).parse().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let (cut_now, _) = watch::channel(false);
        let (accept_cut, accept_cut_now) = (cut.clone(), cut_now.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                if accept_cut.load(Ordering::SeqCst) {
                    // Hang until the partition heals, then fail, so no request from the partition lands late.
                    let mut healed = accept_cut_now.subscribe();
                    tokio::spawn(async move {
                        let _ = healed.wait_for(|cut| !*cut).await;
                        drop(client);
                    });
                    continue;
                }
                let upstream_addr = upstream_addr.clone();
                let mut cut_rx = accept_cut_now.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream_addr).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Relay { url, cut, cut_now }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cut_now.send_replace(true);
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.cut_now.send_replace(false);
    }
}

async fn until(what: &str, limit: Duration, rx: &mut watch::Receiver<bool>, want: bool) {
    tokio::time::timeout(limit, rx.wait_for(|leading| *leading == want))
        .await
        .unwrap_or_else(|_| panic!("{what}: not {want} within {limit:?}"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_another_replica_takes_over() {
    let direct = config().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let relay = Relay::start(&direct.cluster_url).await;
    let mut relayed = direct.clone();
    relayed.cluster_url = relay.url.clone();
    let client_a = Client::try_from(relayed).unwrap();
    let client_b = Client::try_from(direct).unwrap();

    let ns = format!("op-it-fence-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client_b.clone());
    let mut object = Namespace::default();
    object.metadata.name = Some(ns.clone());
    namespaces.create(&PostParams::default(), &object).await.unwrap();
    let lease = |identity: &str| LeaderConfig {
        lease_name: "isthmus-operator".into(),
        lease_namespace: ns.clone(),
        identity: identity.into(),
        duration_s: 4,
        grace_s: 1,
    };

    let a = Election::start(client_a, &lease("replica-a")).await.unwrap();
    let mut a_leads = a.is_leader.clone();
    until("replica-a leads through the relay", Duration::from_secs(30), &mut a_leads, true).await;

    // The partition: replica-a's renewals hang. Replica-b, which still reaches the API server, takes the Lease
    // once it has expired; at no moment may both lead.
    relay.cut();
    let b = Election::start(client_b.clone(), &lease("replica-b")).await.unwrap();
    let mut b_leads = b.is_leader.clone();
    let overlap = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (mut a_rx, mut b_rx, overlap) = (a_leads.clone(), b_leads.clone(), overlap.clone());
        tokio::spawn(async move {
            loop {
                if *a_rx.borrow_and_update() && *b_rx.borrow_and_update() {
                    overlap.store(true, Ordering::SeqCst);
                }
                tokio::select! {
                    r = a_rx.changed() => if r.is_err() { return },
                    r = b_rx.changed() => if r.is_err() { return },
                }
            }
        })
    };
    until("replica-a steps down without the API server", Duration::from_secs(30), &mut a_leads, false).await;
    until("replica-b takes the expired Lease", Duration::from_secs(30), &mut b_leads, true).await;
    assert!(!*a_leads.borrow(), "replica-a still leads when replica-b takes over");
    watcher.abort();
    let _ = watcher.await;
    assert!(!overlap.load(Ordering::SeqCst), "two replicas led at the same time");

    // The partition heals and replica-b leaves: replica-a leads again.
    relay.restore();
    b.release(vec![b_leads]).await;
    until("replica-a takes over again", Duration::from_secs(30), &mut a_leads, true).await;
    a.release(vec![a_leads]).await;
    namespaces.delete(&ns, &DeleteParams::default()).await.unwrap();
}
