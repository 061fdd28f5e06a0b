use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

use super::*;

fn hook(name: &str, target: HookTarget, events: &[HookEvent], timeout: Duration) -> Hook {
    Hook {
        name: name.to_owned(),
        target,
        events: events.to_vec(),
        timeout,
    }
}

fn sh(script: &str) -> HookTarget {
    HookTarget::Command(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

fn health() -> Event {
    Event::Health {
        time: 1_700_000_000_000_000_000,
        pool: "dc1".into(),
        backend: IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1)),
        from: "up".into(),
        to: "down".into(),
        detail: "connection refused".into(),
    }
}

fn switch() -> Event {
    Event::Switch {
        time: 1_700_000_000_000_000_001,
        group: "web-failover".into(),
        from: Some("pool=dc1".into()),
        to: "pool=dc2".into(),
        by: "rule".into(),
        rule: Some("failover-dc2".into()),
        cause: "dc1_api_healthy".into(),
    }
}

/// The status of the only hook once `pred` holds (every 10 ms, up to 10 s).
async fn once(hooks: &Hooks, pred: impl Fn(&HookStatus) -> bool) -> HookStatus {
    let start = Instant::now();
    loop {
        let status = hooks.status().remove(0);
        if pred(&status) {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never reached: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn hooks_of(list: &[Hook]) -> Hooks {
    let mut hooks = Hooks::new(Family::default());
    hooks.configure(list);
    hooks
}

#[test]
fn an_event_is_json_with_its_kind_and_time_first() {
    let json = serde_json::to_value(switch()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "kind": "switch", "time": 1_700_000_000_000_000_001_u64, "group": "web-failover",
            "from": "pool=dc1", "to": "pool=dc2", "by": "rule", "rule": "failover-dc2",
            "cause": "dc1_api_healthy"
        })
    );
    let json = serde_json::to_value(health()).unwrap();
    assert_eq!(json["kind"], "health");
    assert_eq!(json["backend"], "198.18.1.1");
    let rejected = Event::ConfigRejected {
        time: 1,
        source: "watch".into(),
        errors: vec!["a.yaml:1 pools: expected a list".into()],
    };
    let json = serde_json::to_value(&rejected).unwrap();
    assert_eq!(json["kind"], "config_rejected");
    assert_eq!(json["errors"][0], "a.yaml:1 pools: expected a list");
    assert_eq!(rejected.kind(), HookEvent::ConfigRejected);
}

#[test]
fn a_rejection_splits_into_problems_with_their_indented_lines() {
    let text = "a.yaml:3 state.x.expr: unknown name\n    x AND y\n    ^\nb.yaml:1 pools: bad\n";
    assert_eq!(
        Event::problems(text),
        vec![
            "a.yaml:3 state.x.expr: unknown name\n    x AND y\n    ^".to_owned(),
            "b.yaml:1 pools: bad".to_owned(),
        ]
    );
}

#[tokio::test]
async fn a_command_gets_the_event_on_stdin_and_in_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (stdin, env) = (dir.path().join("stdin"), dir.path().join("env"));
    let script = format!(
        "cat > {}; printf %s \"$SWITCHYARD_EVENT\" > {}",
        stdin.display(),
        env.display()
    );
    let mut hooks = hooks_of(&[hook(
        "log",
        sh(&script),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    hooks.emit(&health());
    let status = once(&hooks, |s| s.ok == 1).await;
    assert_eq!((status.failed, status.timeout, status.dropped), (0, 0, 0));
    let expected = serde_json::to_string(&health()).unwrap();
    assert_eq!(std::fs::read_to_string(&stdin).unwrap(), expected);
    assert_eq!(std::fs::read_to_string(&env).unwrap(), expected);
}

#[tokio::test]
async fn a_hook_gets_only_the_events_it_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("events");
    let script = format!("cat >> {}; echo >> {}", out.display(), out.display());
    let mut hooks = hooks_of(&[hook(
        "health-only",
        sh(&script),
        &[HookEvent::Health],
        Duration::from_secs(5),
    )]);
    hooks.emit(&switch());
    hooks.emit(&health());
    once(&hooks, |s| s.ok == 1).await;
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"kind\":\"health\""), "{text}");
}

#[tokio::test]
async fn a_failing_command_is_counted_with_its_exit_status() {
    let mut hooks = hooks_of(&[hook(
        "fails",
        sh("exit 3"),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    hooks.emit(&health());
    let status = once(&hooks, |s| s.failed == 1).await;
    assert_eq!(status.ok, 0);
    let why = status.last_failure.unwrap();
    assert!(why.contains("exit status: 3"), "{why}");
    let mut missing = hooks_of(&[hook(
        "missing",
        HookTarget::Command(vec!["/nonexistent/hook".into()]),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    missing.emit(&health());
    let status = once(&missing, |s| s.failed == 1).await;
    assert!(
        status
            .last_failure
            .unwrap()
            .starts_with("cannot run /nonexistent/hook"),
    );
}

/// Whether process `pid` is gone (or a zombie, dead and waiting for its parent).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn a_command_past_its_timeout_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pid = dir.path().join("pid");
    // The shell waits for a background sleep: killing the shell alone would leave the sleep.
    let script = format!("sleep 3600 & echo $! > {}; wait", pid.display());
    let mut hooks = hooks_of(&[hook(
        "hangs",
        sh(&script),
        &HookEvent::ALL,
        Duration::from_millis(300),
    )]);
    hooks.emit(&health());
    let status = once(&hooks, |s| s.timeout == 1).await;
    assert_eq!((status.ok, status.failed), (0, 0));
    assert_eq!(
        status.last_failure.as_deref(),
        Some("timed out after 300ms")
    );
    let sleep = std::fs::read_to_string(&pid).unwrap();
    let sleep = sleep.trim();
    let start = Instant::now();
    while !gone(sleep) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the hook's sleep {sleep} survived its timeout"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_full_queue_drops_events_and_counts_them_without_waiting() {
    let mut hooks = hooks_of(&[hook(
        "hangs",
        sh("sleep 3600"),
        &HookEvent::ALL,
        Duration::from_mins(1),
    )]);
    let offered = QUEUE + 10;
    for _ in 0..offered {
        hooks.emit(&health());
    }
    let status = hooks.status().remove(0);
    // The task may have taken the first event out of the queue before the queue filled.
    let dropped = usize::try_from(status.dropped).unwrap();
    assert!(
        (offered - QUEUE - 1..=offered - QUEUE).contains(&dropped),
        "{status:?}"
    );
    assert!(status.queued >= QUEUE - 1, "{status:?}");
}

#[tokio::test]
async fn a_reload_keeps_an_unchanged_hook_and_stops_a_removed_one() {
    let dir = tempfile::tempdir().unwrap();
    let pid = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 3600", pid.display());
    let long = hook("long", sh(&script), &HookEvent::ALL, Duration::from_mins(1));
    let other = hook("other", sh("true"), &HookEvent::ALL, Duration::from_secs(1));
    let mut hooks = hooks_of(std::slice::from_ref(&long));
    hooks.emit(&health());
    let start = Instant::now();
    while std::fs::read_to_string(&pid).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the hook never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = std::fs::read_to_string(&pid).unwrap().trim().to_owned();
    hooks.configure(&[long, other]);
    assert!(!gone(&running), "an unchanged hook was restarted");
    assert_eq!(hooks.status().len(), 2);
    hooks.configure(&[]);
    let start = Instant::now();
    while !gone(&running) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a removed hook's command survived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hooks.status().is_empty());
}

/// A one-connection-at-a-time HTTP server answering `status` to every request; each request's
/// head and body go to the returned receiver.
async fn server(status: u16) -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            let (head, body) = loop {
                let n = stream.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break (String::from_utf8_lossy(&data).into_owned(), String::new());
                }
                data.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&data).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break (head.to_owned(), body.to_owned());
                    }
                }
            };
            let _ = tx.send((head, body));
            let reply =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.write_all(reply.as_bytes()).await;
        }
    });
    (port, rx)
}

#[tokio::test]
async fn a_url_hook_posts_the_event_as_json() {
    let (port, mut requests) = server(204).await;
    let url = format!("http://127.0.0.1:{port}/events");
    let mut hooks = hooks_of(&[hook(
        "post",
        HookTarget::Url(url),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    hooks.emit(&switch());
    once(&hooks, |s| s.ok == 1).await;
    let (head, body) = requests.recv().await.unwrap();
    assert!(head.starts_with("POST /events HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    assert_eq!(body, serde_json::to_string(&switch()).unwrap());
}

#[tokio::test]
async fn a_url_hook_fails_on_a_status_other_than_2xx_and_on_a_closed_port() {
    let (port, _requests) = server(500).await;
    let mut hooks = hooks_of(&[hook(
        "post",
        HookTarget::Url(format!("http://127.0.0.1:{port}/")),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    hooks.emit(&switch());
    let status = once(&hooks, |s| s.failed == 1).await;
    assert_eq!(status.last_failure.as_deref(), Some("status 500"));
    let closed = {
        let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    let mut hooks = hooks_of(&[hook(
        "post",
        HookTarget::Url(format!("http://127.0.0.1:{closed}/")),
        &HookEvent::ALL,
        Duration::from_secs(5),
    )]);
    hooks.emit(&switch());
    let status = once(&hooks, |s| s.failed == 1).await;
    assert!(
        status.last_failure.unwrap().contains("refused"),
        "a closed port"
    );
}

#[tokio::test]
async fn a_url_hook_that_gets_no_answer_times_out() {
    // Accepts connections (the kernel's backlog) and never answers.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut hooks = hooks_of(&[hook(
        "post",
        HookTarget::Url(format!("http://127.0.0.1:{port}/")),
        &HookEvent::ALL,
        Duration::from_millis(200),
    )]);
    hooks.emit(&switch());
    let status = once(&hooks, |s| s.timeout == 1).await;
    assert_eq!((status.ok, status.failed), (0, 0));
    drop(listener);
}

#[tokio::test]
async fn standard_error_reaches_the_log_bounded_and_escaped() {
    let mut lines = Vec::new();
    let input: &[u8] = b"one\n\x1b[31mred\nlast without newline";
    let left = stderr_lines(input, |l| lines.push(l.to_owned())).await;
    assert_eq!(left, 0);
    assert_eq!(lines, ["one", "\\u{1b}[31mred", "last without newline"]);

    // One line of 200,000 bytes: its first STDERR_LINE_LIMIT bytes, the rest counted.
    let mut lines = Vec::new();
    let long = vec![b'x'; 200_000];
    let left = stderr_lines(&long[..], |l| lines.push(l.to_owned())).await;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].len(), STDERR_LINE_LIMIT);
    assert_eq!(left, 200_000 - STDERR_LINE_LIMIT);

    // Many short lines: at most STDERR_LIMIT bytes of them, the rest counted.
    let mut logged = 0;
    let many = b"0123456789abcdef\n".repeat(10_000);
    let left = stderr_lines(&many[..], |l| logged += l.len() + 1).await;
    assert!(logged < STDERR_LIMIT, "{logged}");
    assert_eq!(logged + left, many.len());
}
