//! The `redquorum` binary over mutual TLS as the least-privilege user that `redquorum acl`
//! prints: the TLS options (`--cacert`, `--cert`, `--key`, `--sni`), `acl`, and `check
//! --feature` naming what the user lacks, in text and JSON.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::process::Output;

use redquorum_testkit::secure::{Pki, TlsNode, SERVER_NAME};

const BIN: &str = env!("CARGO_BIN_EXE_redquorum");

async fn redquorum(args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("REDQUORUM_NODES")
        .env_remove("REDQUORUM_CLUSTER")
        .env_remove("REDQUORUM_CACERT")
        .env_remove("REDQUORUM_CERT")
        .env_remove("REDQUORUM_KEY")
        .env_remove("REDQUORUM_SNI")
        .env_remove("REDQUORUM_ATTEST_FSYNC_ALWAYS")
        .output()
        .await
        .expect("the redquorum binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_over_mutual_tls_as_the_printed_acl_user() {
    let pki = Pki::generate();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(TlsNode::start(&pki, "yes", &[]).await);
    }
    // The user, exactly as `redquorum acl` prints it for IDs, run line by line.
    let acl = redquorum(&["acl", "--user", "rq", "--feature", "ids"]).await;
    assert_eq!(acl.status.code(), Some(0), "{}", text(&acl));
    let lines: Vec<String> = String::from_utf8_lossy(&acl.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert!(
        lines.iter().all(|l| l.starts_with("ACL SETUSER rq ")) && !text(&acl).contains('>'),
        "complete commands without a password: {lines:?}"
    );
    assert!(
        !text(&acl).contains("config"),
        "no CONFIG GET by default: {lines:?}"
    );
    for node in &nodes {
        let mut admin = node.admin(&pki).await;
        for line in lines
            .iter()
            .chain(["ACL SETUSER rq >pw".to_string()].iter())
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            let mut cmd = redis::cmd(words[0]);
            for w in &words[1..] {
                cmd.arg(*w);
            }
            let () = cmd.query_async(&mut admin).await.expect(line);
        }
    }
    // 127.0.0.1 in the URLs, the certificate's other name verified through --sni.
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("rediss://rq:pw@127.0.0.1:{}", n.port()))
        .collect();
    let list = urls.join(",");
    let (ca, cert, key) = (
        pki.ca.to_str().unwrap(),
        pki.client.cert.to_str().unwrap(),
        pki.client.key.to_str().unwrap(),
    );
    let tls = [
        "--nodes",
        &list,
        "--cacert",
        ca,
        "--cert",
        cert,
        "--key",
        key,
        "--sni",
        SERVER_NAME,
        "--node-timeout",
        "2s",
        "--attest-fsync-always",
    ];
    let run = |extra: &[&str]| {
        let mut args: Vec<String> = tls.iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            redquorum(&args).await
        }
    };
    let out = run(&["cluster", "init"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&["check", "--feature", "ids"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&["id", "next", "s", "-n", "3"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    // The IDs user lacks what distribution needs: named, exit 1, in text and JSON.
    let out = run(&["check", "--feature", "distribution"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("lacks +zadd (needed by distribution)"),
        "{}",
        text(&out)
    );
    let out = run(&["--output", "json", "check", "--feature", "distribution"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["all_permitted"], false, "{v}");
    assert_eq!(v["all_safe"], true, "{v}");
    for n in v["nodes"].as_array().unwrap() {
        assert!(
            n["missing_permissions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["permission"] == "zadd" && m["features"][0] == "distribution"),
            "{n}"
        );
    }
    // Without attesting fsync, the missing CONFIG GET is named (every client needs it then).
    let mut args: Vec<&str> = tls
        .iter()
        .copied()
        .filter(|a| *a != "--attest-fsync-always")
        .collect();
    args.extend(["check", "--feature", "ids"]);
    let out = redquorum(&args).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(
            "lacks +config|get (needed by every client, unless the fsync policy is attested"
        ),
        "{}",
        text(&out)
    );
    // Every TLS option matters: a wrong server name, no client certificate, another CA.
    for (what, drop, replace, hint) in [
        (
            "a wrong --sni",
            "--sni",
            Some(("--sni", "other.example")),
            "--sni",
        ),
        ("no client certificate", "--cert", None, "--cert"),
        (
            "another CA",
            "--cacert",
            Some(("--cacert", pki.other_ca.to_str().unwrap())),
            "--cacert",
        ),
    ] {
        let mut args: Vec<&str> = Vec::new();
        let mut skip = 0;
        for a in tls.iter().copied() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if a == drop {
                skip = 1;
                if let Some((flag, value)) = replace {
                    args.extend([flag, value]);
                }
                continue;
            }
            if drop == "--cert" && a == "--key" {
                skip = 1;
                continue;
            }
            args.push(a);
        }
        args.extend(["check", "--feature", "ids"]);
        let out = redquorum(&args).await;
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        assert!(
            text(&out).contains(hint),
            "{what}: should name {hint}: {}",
            text(&out)
        );
    }
}
