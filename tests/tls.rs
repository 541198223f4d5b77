//! TLS and least privilege against real `redis-server` nodes serving TLS only, with
//! certificates made by the test (rcgen): mutual TLS, a CA file, the server name, the errors
//! a wrong CA or a missing client certificate give, and the permission check.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::time::Duration;

use redquorum::acl::{self, Feature};
use redquorum::{Client, Config, IdGenerator, Lock};
use redquorum_testkit::secure::{Pki, TlsNode, SERVER_NAME};

use common::init_tracing;

async fn nodes(pki: &Pki, clients: &str) -> Vec<TlsNode> {
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(TlsNode::start(pki, clients, &[]).await);
    }
    out
}

fn urls(nodes: &[TlsNode], host: &str, user: Option<&str>) -> Vec<String> {
    nodes
        .iter()
        .map(|n| match user {
            Some(u) => format!("rediss://{u}:pw@{host}:{}", n.port()),
            None => format!("rediss://{host}:{}", n.port()),
        })
        .collect()
}

fn config(urls: Vec<String>) -> Config {
    Config::from_urls(urls)
        .expect("valid URLs")
        .with_node_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500))
        .with_operation_timeout(Duration::from_secs(2))
}

/// IDs and a lock work, and every node checks safe.
async fn works(client: &Client, what: &str) {
    let gen = IdGenerator::new(client, "tls").expect("valid name");
    let a = gen
        .next_id()
        .await
        .unwrap_or_else(|e| panic!("{what}: no ID: {e}"));
    let b = gen.next_id().await.expect("a second ID");
    assert!(b > a, "{what}: IDs increase");
    let lock = Lock::new(client, "tls-lock", Duration::from_secs(5)).expect("valid");
    let guard = lock
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{what}: no lease: {e}"));
    guard.release().await.expect("release");
    for r in client.check().await {
        assert!(
            r.is_safe(),
            "{what}: node {} is not safe: {}",
            r.node,
            r.summary()
        );
    }
}

/// The reasons every node gave in `check`, and the error an ID request gives.
async fn failure(config: Config) -> String {
    let client = common::connect(config).await.expect("config is valid");
    let mut reasons: Vec<String> = client.check().await.iter().map(|r| r.summary()).collect();
    let err = IdGenerator::new(&client, "tls")
        .expect("valid")
        .next_id()
        .await
        .expect_err("no node can be reached");
    reasons.push(err.to_string());
    reasons.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_ca_file_and_a_client_certificate_serves_every_operation() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "yes").await;
    let client = common::connect(
        config(urls(&nodes, "127.0.0.1", None))
            .with_ca_file(&pki.ca)
            .expect("CA")
            .with_client_cert(&pki.client.cert, &pki.client.key)
            .expect("client certificate"),
    )
    .await
    .expect("valid");
    works(&client, "mutual TLS").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_authentication_the_ca_file_alone_is_enough() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "no").await;
    let client = common::connect(
        config(urls(&nodes, "localhost", None))
            .with_ca_file(&pki.ca)
            .expect("CA"),
    )
    .await
    .expect("valid");
    works(&client, "server-only TLS").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_name_is_verified_in_place_of_the_urls_host() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "yes").await;
    let base = || {
        config(urls(&nodes, "127.0.0.1", None))
            .with_ca_file(&pki.ca)
            .expect("CA")
            .with_client_cert(&pki.client.cert, &pki.client.key)
            .expect("client certificate")
    };
    // The certificate names node.redquorum.test, which no resolver knows: the connection
    // still goes to 127.0.0.1, and the name is what is verified.
    let client = common::connect(base().with_server_name(SERVER_NAME).expect("valid name"))
        .await
        .expect("valid");
    works(&client, "server name").await;
    let why = failure(
        base()
            .with_server_name("other.example")
            .expect("valid name"),
    )
    .await;
    assert!(
        why.contains("--sni"),
        "a certificate that does not name the server name should point at --sni:\n{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_fails_with_an_error_that_names_the_ca_setting() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "yes").await;
    let why = failure(
        config(urls(&nodes, "127.0.0.1", None))
            .with_ca_file(&pki.other_ca)
            .expect("a valid CA file, of another CA")
            .with_client_cert(&pki.client.cert, &pki.client.key)
            .expect("client certificate"),
    )
    .await;
    assert!(
        why.contains("not signed by a trusted CA") && why.contains("--cacert"),
        "a wrong CA should be named as such:\n{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_requires_a_client_certificate_says_so_to_a_client_without_one() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "yes").await;
    let why = failure(
        config(urls(&nodes, "127.0.0.1", None))
            .with_ca_file(&pki.ca)
            .expect("CA"),
    )
    .await;
    assert!(
        why.contains("--cert"),
        "a refused client without a certificate should be pointed at --cert:\n{why}"
    );
    // A certificate from another CA is refused the same way.
    let why = failure(
        config(urls(&nodes, "127.0.0.1", None))
            .with_ca_file(&pki.ca)
            .expect("CA")
            .with_client_cert(&pki.other_client.cert, &pki.other_client.key)
            .expect("a valid certificate, of another CA"),
    )
    .await;
    assert!(
        why.contains("--cert"),
        "a client certificate of another CA should point at --cert:\n{why}"
    );
}

#[test]
fn tls_files_are_checked_when_set_and_name_their_setting() {
    let pki = Pki::generate();
    let tls = || Config::from_urls(["rediss://127.0.0.1:1"]).expect("valid");
    let e = tls()
        .with_ca_file(pki.dir().join("missing.crt"))
        .expect_err("missing");
    assert!(
        e.to_string().contains("--cacert") && e.to_string().contains("missing.crt"),
        "{e}"
    );
    let e = tls()
        .with_ca_file(&pki.client.key)
        .expect_err("a key is no CA");
    assert!(e.to_string().contains("holds no certificate"), "{e}");
    let e = tls()
        .with_client_cert(&pki.client.cert, &pki.other_client.key)
        .expect_err("key of another certificate");
    assert!(
        e.to_string().contains("--key") && e.to_string().contains("does not fit"),
        "{e}"
    );
    let e = tls()
        .with_client_cert(&pki.client.cert, &pki.client.cert)
        .expect_err("a certificate is no key");
    assert!(e.to_string().contains("no private key"), "{e}");
    let e = tls().with_server_name("not a name").expect_err("bad name");
    assert!(e.to_string().contains("--sni"), "{e}");
    let e = tls().with_ca_file(pki.dir()).expect_err("a directory");
    assert!(e.to_string().contains("directory"), "{e}");
    // TLS settings with a plain node would be silently ignored: refused instead.
    let e = Config::from_urls(["rediss://127.0.0.1:1", "redis://127.0.0.1:2"])
        .expect("valid")
        .with_ca_file(&pki.ca)
        .expect("CA")
        .validate()
        .expect_err("a plain node with TLS settings");
    assert!(
        e.to_string().contains("node 1") && e.to_string().contains("rediss://"),
        "{e}"
    );
}

/// Make the user `rq` (password `pw`) on every node from `acl` lines, as redis-cli would.
async fn make_user(pki: &Pki, nodes: &[TlsNode], lines: &[String]) {
    for node in nodes {
        let mut admin = node.admin(pki).await;
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            let mut cmd = redis::cmd(words[0]);
            for w in &words[1..] {
                cmd.arg(*w);
            }
            let () = cmd.query_async(&mut admin).await.expect(line);
        }
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("rq")
            .arg(">pw")
            .query_async(&mut admin)
            .await
            .expect("password");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permission_check_names_what_the_user_lacks_and_which_feature_needs_it() {
    init_tracing();
    let pki = Pki::generate();
    let nodes = nodes(&pki, "yes").await;
    let tls = |cfg: Config| {
        cfg.with_ca_file(&pki.ca)
            .expect("CA")
            .with_client_cert(&pki.client.cert, &pki.client.key)
            .expect("client certificate")
    };
    // A user made for IDs only.
    make_user(
        &pki,
        &nodes,
        &acl::setuser_lines("rq", &[Feature::Ids], true).expect("lines"),
    )
    .await;
    let client = common::connect(tls(config(urls(&nodes, "127.0.0.1", Some("rq")))))
        .await
        .expect("valid");
    works_for_ids(&client).await;
    for r in client.check_permissions(&[Feature::Ids]).await {
        assert_eq!(
            r.missing,
            Ok(vec![]),
            "node {}: IDs need nothing more",
            r.node
        );
    }
    for r in client.check_permissions(&[Feature::Distribution]).await {
        let missing = r.missing.expect("checked");
        let zadd = missing
            .iter()
            .find(|m| m.permission == "zadd")
            .unwrap_or_else(|| {
                panic!("node {}: zadd is not reported missing: {missing:?}", r.node)
            });
        assert_eq!(zadd.features, vec![Feature::Distribution]);
        assert!(
            zadd.to_string().contains("+zadd (needed by distribution)"),
            "{zadd}"
        );
    }
    // Without CONFIG GET every client is short of a base permission, unless fsync is attested.
    make_user(
        &pki,
        &nodes,
        &[
            acl::setuser_lines("rq", &[Feature::Ids], true).expect("lines")[0].clone(),
            "ACL SETUSER rq -config|get".into(),
        ],
    )
    .await;
    let client = common::connect(tls(config(urls(&nodes, "127.0.0.1", Some("rq")))))
        .await
        .expect("valid");
    for r in client.check_permissions(&[Feature::Ids]).await {
        let missing = r.missing.expect("checked");
        assert!(
            missing
                .iter()
                .any(|m| m.permission == "config|get" && m.features.is_empty()),
            "node {}: config|get should be missing for every client: {missing:?}",
            r.node
        );
    }
    let attested = common::connect(
        tls(config(urls(&nodes, "127.0.0.1", Some("rq")))).with_fsync_always_attested(true),
    )
    .await
    .expect("valid");
    for r in attested.check_permissions(&[Feature::Ids]).await {
        assert_eq!(
            r.missing,
            Ok(vec![]),
            "node {}: attested fsync needs no CONFIG GET",
            r.node
        );
    }
    works_for_ids(&attested).await;
    // A user without EVALSHA cannot run the check's script: that is what it reports.
    make_user(&pki, &nodes, &["ACL SETUSER rq -evalsha".into()]).await;
    for r in attested.check_permissions(&[Feature::Ids]).await {
        let missing = r.missing.expect("checked");
        assert!(
            missing.iter().any(|m| m.permission == "evalsha"),
            "node {}: {missing:?}",
            r.node
        );
    }
}

async fn works_for_ids(client: &Client) {
    let gen = IdGenerator::new(client, "acl").expect("valid");
    gen.next_id().await.expect("IDs under the IDs user");
}
