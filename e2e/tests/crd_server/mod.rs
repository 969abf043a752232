//! A real CRD server for the tests: etcd 3.5.30 and
//! `k8s.io/apiextensions-apiserver` 0.36.4 built from Debian's sources
//! (`ci/real-peers.sh` prints `KROCE_ETCD` and `KROCE_APIEXTENSIONS`), on
//! loopback, TLS everywhere with a CA made here: etcd serves TLS and wants
//! client certificates; the API server serves TLS and authenticates clients
//! by certificate (group `system:masters`, which its delegating authorizer
//! always allows).
//!
//! One server per test process, started by the first test that asks and
//! shared (each test uses its own object names). A reaper shell holds the
//! read end of a pipe whose write end lives in a static: when the test
//! process exits, however it exits, the reaper kills both servers and
//! removes their directory.
//!
//! What this server is not: it serves only `apiextensions.k8s.io` and the
//! custom resources it defines. No discovery (`/api`, `/apis` are 404), no
//! Nodes, Pods, ConfigMaps, Leases or Events: tests of code that needs
//! those keep using the in-memory mock (`controller::mock`).

pub mod core_stub;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const ETCD_ENV: &str = "KROCE_ETCD";
pub const APISERVER_ENV: &str = "KROCE_APIEXTENSIONS";

/// The two programs, from the environment.
#[derive(Debug, Clone)]
pub struct Peers {
    pub etcd: PathBuf,
    pub apiserver: PathBuf,
}

/// The peers, or `None` after saying why the caller skips. In CI (env `CI`
/// set) a missing peer is a failure, not a skip.
pub fn peers() -> Option<Peers> {
    let find = |var: &str| -> Result<PathBuf, String> {
        let path = std::env::var_os(var).ok_or_else(|| format!("{var} is not set"))?;
        let path = PathBuf::from(path);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{var}={} does not exist", path.display()))
        }
    };
    match (find(ETCD_ENV), find(APISERVER_ENV)) {
        (Ok(etcd), Ok(apiserver)) => Some(Peers { etcd, apiserver }),
        (e, a) => {
            let why: Vec<String> = [e.err(), a.err()].into_iter().flatten().collect();
            let why = why.join("; ");
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the real CRD server tests, but {why} (ci/real-peers.sh)");
            }
            eprintln!(
                "skipped: no real CRD server ({why}); \
                 eval \"$(ci/real-peers.sh | sed 's/^/export /')\" first"
            );
            None
        }
    }
}

/// A running server and what a client needs to reach it.
#[derive(Debug)]
pub struct CrdServer {
    pub dir: PathBuf,
    /// Kubeconfig for an admin (client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    pub url: String,
    pub seconds_to_healthy: f64,
    children: Mutex<Vec<Child>>,
    /// Its drop (process exit) tells the reaper to clean up.
    _reaper_pipe: Mutex<ChildStdin>,
}

static SERVER: OnceLock<Result<CrdServer, String>> = OnceLock::new();

/// The shared server, started on first use; `None` when skipped (see
/// [`peers`]). Panics with the servers' logs when it does not come up.
pub fn server() -> Option<&'static CrdServer> {
    let peers = peers()?;
    // Started on a thread of its own: callers may be inside a runtime.
    // Ports are picked free and then bound by the servers: another process
    // can take one in between, so that failure is retried.
    let init = || {
        let mut tries = 0;
        loop {
            let p = peers.clone();
            let r = std::thread::spawn(move || start(&p))
                .join()
                .unwrap_or_else(|_| Err("the start thread panicked".into()));
            tries += 1;
            match r {
                Err(e) if tries < 3 && e.contains("address already in use") => continue,
                r => return r,
            }
        }
    };
    match SERVER.get_or_init(init) {
        Ok(s) => Some(s),
        Err(e) => panic!("the real CRD server did not start: {e}"),
    }
}

impl CrdServer {
    /// A kube client over HTTPS from the kubeconfig: the same path the
    /// shipped binaries take (rustls, client certificate, CA from a file).
    pub async fn client(&self) -> kube::Client {
        install_crypto_provider();
        let kc = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("client config");
        kube::Client::try_from(config).expect("client")
    }
}

/// The same provider `kroce-operator`'s main installs (an Err only means
/// one is installed already).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// CA, one serving certificate for both servers (127.0.0.1, localhost)
/// and client certificates for the admin and for the API server's etcd
/// client; PEM files in `dir`.
fn write_pki(dir: &Path) -> Result<(), rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "kroce-test-ca");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).expect("write pki file");
    };
    write("ca.crt", ca_cert.pem());
    let leaf = |name: &str, sans: &[&str], cn: &str, org: Option<&str>, server: bool| {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        p.distinguished_name.push(DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name.push(DnType::OrganizationName, o);
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = if server {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        let cert = p.signed_by(&key, &issuer)?;
        write(&format!("{name}.crt"), cert.pem());
        write(&format!("{name}.key"), key.serialize_pem());
        Ok::<(), rcgen::Error>(())
    };
    leaf(
        "server",
        &["127.0.0.1", "localhost"],
        "127.0.0.1",
        None,
        true,
    )?;
    leaf(
        "admin",
        &[],
        "kroce-test-admin",
        Some("system:masters"),
        false,
    )?;
    leaf(
        "etcd-client",
        &[],
        "kube-apiserver-etcd-client",
        None,
        false,
    )?;
    Ok(())
}

fn kubeconfig_text(dir: &Path, url: &str) -> String {
    let d = dir.display();
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: crd\n  cluster:\n    server: {url}\n    certificate-authority: {d}/ca.crt\n\
         users:\n- name: admin\n  user:\n    client-certificate: {d}/admin.crt\n    client-key: {d}/admin.key\n\
         contexts:\n- name: crd\n  context:\n    cluster: crd\n    user: admin\n\
         current-context: crd\n"
    )
}

fn spawn_logged(dir: &Path, name: &str, program: &Path, args: &[String]) -> Result<Child, String> {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))
}

fn start(peers: &Peers) -> Result<CrdServer, String> {
    let dir = tempfile::Builder::new()
        .prefix("kroce-crd-server-")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    write_pki(&dir).map_err(|e| format!("certificates: {e}"))?;
    let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
    let d = dir.display().to_string();
    let etcd_url = format!("https://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd_args: Vec<String> = [
        "--name=kroce-test".to_string(),
        format!("--data-dir={d}/etcd"),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=kroce-test={peer_url}"),
        format!("--cert-file={d}/server.crt"),
        format!("--key-file={d}/server.key"),
        format!("--trusted-ca-file={d}/ca.crt"),
        "--client-cert-auth".to_string(),
        // A test's data: durability is not the point, speed on a shared disk is.
        "--unsafe-no-fsync".to_string(),
    ]
    .to_vec();
    let url = format!("https://127.0.0.1:{api_port}");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_text(&dir, &url)).map_err(|e| e.to_string())?;
    let k = kubeconfig.display();
    let api_args: Vec<String> = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--etcd-cafile={d}/ca.crt"),
        format!("--etcd-certfile={d}/etcd-client.crt"),
        format!("--etcd-keyfile={d}/etcd-client.key"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--tls-cert-file={d}/server.crt"),
        format!("--tls-private-key-file={d}/server.key"),
        format!("--cert-dir={d}/certs"),
        format!("--client-ca-file={d}/ca.crt"),
        // Its own kubeconfig (admin in system:masters) for delegated
        // authn/authz; without these it looks for in-cluster config.
        "--authentication-skip-lookup".into(),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        format!("--kubeconfig={k}"),
        // These need core APIs (Namespaces, admission registration) it does not serve.
        "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionPolicy,\
         MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook"
            .into(),
        "--enable-priority-and-fairness=false".into(),
    ];
    let etcd = spawn_logged(&dir, "etcd", &peers.etcd, &etcd_args)?;
    let api = match spawn_logged(&dir, "apiserver", &peers.apiserver, &api_args) {
        Ok(c) => c,
        Err(e) => {
            let mut etcd = etcd;
            let _ = etcd.kill();
            return Err(e);
        }
    };
    // The reaper: EOF on its stdin (this process gone) kills both servers
    // and removes the directory.
    let mut reaper = Command::new("sh")
        .arg("-c")
        .arg(
            "read -r _; kill \"$2\" \"$3\" 2>/dev/null; sleep 2; \
             kill -9 \"$2\" \"$3\" 2>/dev/null; rm -rf \"$1\"",
        )
        .arg("reaper")
        .arg(&dir)
        .arg(etcd.id().to_string())
        .arg(api.id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    let pipe = reaper.stdin.take().ok_or("reaper stdin")?;
    let server = CrdServer {
        dir: dir.clone(),
        kubeconfig,
        url,
        seconds_to_healthy: 0.0,
        children: Mutex::new(vec![etcd, api]),
        _reaper_pipe: Mutex::new(pipe),
    };
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(wait_healthy(&server, Duration::from_secs(120)))?;
    rt.block_on(install_crds(&server))?;
    Ok(CrdServer {
        seconds_to_healthy: started.elapsed().as_secs_f64(),
        ..server
    })
}

/// Until `/healthz` says ok (`/readyz` stays 500 on this server: its
/// informers wait for core APIs it does not have).
async fn wait_healthy(server: &CrdServer, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    let client = server.client().await;
    let mut last = String::new();
    while start.elapsed() < limit {
        {
            let mut children = server.children.lock().map_err(|e| e.to_string())?;
            for (c, name) in children.iter_mut().zip(["etcd", "apiserver"]) {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(format!(
                        "{name} exited ({st}):\n{}",
                        log_tail(&server.dir, name)
                    ));
                }
            }
        }
        let req = http::Request::get("/healthz")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "/healthz not ok after {limit:?} (last: {last})\n--- apiserver:\n{}\n--- etcd:\n{}",
        log_tail(&server.dir, "apiserver"),
        log_tail(&server.dir, "etcd")
    ))
}

/// The CRD files the tests install: the chart's generated CRDs.
pub fn crd_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kroce/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("charts/kroce/crds")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every CRD the tests install: the chart's, and kroce's view of Multus's
/// NetworkAttachmentDefinition (the repository ships no copy of Multus's
/// own CRD; the operator writes only `spec.config`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut out = Vec::new();
    for f in crd_files() {
        let text = std::fs::read_to_string(&f).expect("read crd file");
        let docs: Vec<CustomResourceDefinition> =
            serde_saphyr::from_multiple(&text).expect("CRD YAML");
        out.extend(docs);
    }
    out.push(
        <kroce_operator::plan::nad::NetworkAttachmentDefinition as kube::CustomResourceExt>::crd(),
    );
    out
}

/// Creates every CRD and waits until each is Established.
async fn install_crds(server: &CrdServer) -> Result<(), String> {
    let client = server.client().await;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| format!("creating CRD {name}: {e}"))?;
    }
    let start = Instant::now();
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let got = api.get(&name).await.map_err(|e| format!("{name}: {e}"))?;
            let established = got
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(format!("CRD {name} not Established: {:?}", got.status));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
