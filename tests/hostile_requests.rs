//! Hostile requests an attacker sends over HTTP: a page of another origin riding the
//! dashboard's session cookie, bodies made to blow up the parse, uploads over the limit sent
//! without a length, and names and values made to corrupt what the server writes.

mod support;

use serde_json::{json, Value};
use support::{error_code, raw_client, session_cookie, Options, Server};
use tungstenite::client::IntoClientRequest;

const TOKEN: &str = "secret-token";

fn token_server(extra: &[&str]) -> Server {
    let mut args = vec!["--token".to_string(), TOKEN.to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    Server::with(Options {
        args,
        token: Some(TOKEN.into()),
        ..Default::default()
    })
}

/// The status of a WebSocket upgrade of `/ws` carrying `cookie` from a page on `origin`, as a
/// browser sends it: 101 when the socket opened.
fn ws_upgrade_status(server: &Server, cookie: &str, origin: &str) -> u16 {
    let url = format!("{}/ws?clientId=attacker", server.base.replacen("http://", "ws://", 1));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert("Cookie", cookie.parse().unwrap());
    request.headers_mut().insert("Origin", origin.parse().unwrap());
    match tungstenite::connect(request) {
        Ok((mut socket, response)) => {
            let _ = socket.close(None);
            response.status().as_u16()
        }
        Err(tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("upgrading /ws: {e}"),
    }
}

/// `http://127.0.0.1:<another port>`: the same host, so the same site, but another origin.
fn same_host_other_port(server: &Server) -> String {
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();
    format!("http://127.0.0.1:{}", if port == 65535 { 65534 } else { port + 1 })
}

#[test]
fn a_websocket_on_the_session_cookie_opens_only_from_the_servers_own_origin() {
    let server = token_server(&[]);
    let cookie = session_cookie(&server, TOKEN);
    assert_eq!(ws_upgrade_status(&server, &cookie, "http://evil.example"), 403);
    assert_eq!(ws_upgrade_status(&server, &cookie, &same_host_other_port(&server)), 403);
    assert_eq!(ws_upgrade_status(&server, &cookie, "null"), 403);
    assert_eq!(ws_upgrade_status(&server, &cookie, &server.base), 101);
}

#[test]
fn an_allowed_origin_may_use_the_session_cookie_and_others_may_not() {
    let server = token_server(&["--allowed-origin", "https://studio.example:8443/"]);
    let cookie = session_cookie(&server, TOKEN);
    assert_eq!(ws_upgrade_status(&server, &cookie, "https://studio.example:8443"), 101);
    assert_eq!(ws_upgrade_status(&server, &cookie, "https://studio.example"), 403);
    assert_eq!(ws_upgrade_status(&server, &cookie, "http://evil.example"), 403);
}

#[test]
fn reads_and_event_streams_on_the_session_cookie_are_refused_to_other_origins() {
    let server = token_server(&[]);
    let cookie = session_cookie(&server, TOKEN);
    let job = server.submit(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "private"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "x"}}
    }));
    let id = job["id"].as_str().unwrap();
    let other_port = same_host_other_port(&server);
    let client = raw_client();
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut rb = client.get(server.url(path)).header("Cookie", &cookie);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let r = rb.send().unwrap();
        let status = r.status().as_u16();
        let body = r.text().unwrap_or_default();
        (status, body)
    };
    let paths = [
        "/api/v2/jobs".to_string(),
        format!("/api/v2/jobs/{id}"),
        format!("/api/v2/jobs/{id}/events"),
        "/history".to_string(),
    ];
    for path in &paths {
        for origin in ["http://evil.example", other_port.as_str()] {
            let (status, body) = get(path, &[("Origin", origin)]);
            assert_eq!(status, 403, "GET {path} from {origin}: {body}");
            assert!(!body.contains("private") && !body.contains(id), "{path} leaked: {body}");
        }
        // A no-cors fetch from another site sends no Origin, but the browser says where from.
        let (status, _) = get(path, &[("Sec-Fetch-Site", "same-site"), ("Sec-Fetch-Mode", "no-cors")]);
        assert_eq!(status, 403, "GET {path} from a same-site script");
    }
    // The server's own pages read, and a client that is not a browser reads with its cookie.
    assert_eq!(get("/api/v2/jobs", &[("Origin", &server.base)]).0, 200);
    assert_eq!(get("/api/v2/jobs", &[("Sec-Fetch-Site", "same-origin")]).0, 200);
    assert_eq!(get("/api/v2/jobs", &[]).0, 200);
    // A dashboard page fetched by another origin's script shows nothing of the tenant's.
    let (status, body) = get(&format!("/ui/jobs/{id}"), &[("Origin", "http://evil.example")]);
    assert_ne!(status, 200, "{body}");
    // A bearer request is not affected.
    let r = server
        .http
        .get(server.url("/api/v2/jobs"))
        .bearer_auth(TOKEN)
        .header("Origin", "http://evil.example")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// An object of `keys` members, as bytes.
fn object_with_keys(keys: usize) -> String {
    let mut body = String::with_capacity(keys * 12);
    body.push('{');
    for i in 0..keys {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!("\"k{i}\":0"));
    }
    body.push('}');
    body
}

#[test]
fn a_body_with_too_many_keys_in_one_object_is_refused_with_422() {
    let server = Server::start();
    let body = format!("{{\"workflow\": {}}}", object_with_keys(200_000));
    let r = server
        .http
        .post(server.url("/api/v2/jobs"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let answer: Value = r.json().unwrap();
    assert_eq!(error_code(&answer), "too_many_keys", "{answer}");
    // ComfyUI's /prompt is bounded the same way.
    let r = server
        .http
        .post(server.url("/prompt"))
        .header("content-type", "application/json")
        .body(format!("{{\"prompt\": {}}}", object_with_keys(200_000)))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
}

#[test]
fn a_body_with_too_many_keys_in_all_is_refused_with_422() {
    let server = Server::start();
    // 2,000 nodes of 200 inputs each: no object is large, the whole is.
    let node = object_with_keys(200);
    let nodes: Vec<String> = (0..2_000)
        .map(|i| format!("\"{i}\":{{\"class_type\":\"PrimitiveString\",\"inputs\":{node}}}"))
        .collect();
    let body = format!("{{\"workflow\": {{{}}}}}", nodes.join(","));
    let r = server
        .http
        .post(server.url("/api/v2/jobs"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let answer: Value = r.json().unwrap();
    assert_eq!(error_code(&answer), "too_many_keys", "{answer}");
}

/// A body of `n` small numbers: the most a parse makes per byte of text.
fn numbers_body(n: usize) -> String {
    let numbers = vec!["0"; n].join(",");
    format!("{{\"workflow\": {{\"1\": {{\"class_type\": \"PrimitiveInt\", \"inputs\": {{\"value\": [{numbers}]}}}}}}}}")
}

fn post_raw(server: &Server, path: &str, body: String) -> reqwest::blocking::Response {
    server
        .http
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap()
}

#[test]
fn bodies_beyond_the_parse_budget_get_429_with_retry_after_or_413_when_they_never_fit() {
    use std::io::Write;
    let server = Server::with(Options {
        args: vec!["--json-parse-budget-mib".into(), "64".into()],
        ..Default::default()
    });
    // A sender that announces 30 MB and sends them slowly holds 30 MB of the budget while
    // they arrive.
    let address = server.base.trim_start_matches("http://").to_string();
    let mut slow = std::net::TcpStream::connect(&address).unwrap();
    write!(
        slow,
        "POST /api/v2/jobs HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: 30000000\r\n\r\n{{\"workflow\": "
    )
    .unwrap();
    slow.flush().unwrap();
    // 900,000 values parse to about 45 MB: that no longer fits beside it.
    let body = numbers_body(900_000);
    let mut refused = None;
    for _ in 0..100 {
        let r = post_raw(&server, "/api/v2/jobs", body.clone());
        if r.status().as_u16() == 429 {
            refused = Some(r);
            break;
        }
        // The slow request may not have been read yet.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let refused = refused.expect("a parse that does not fit now is refused");
    assert!(refused.headers().contains_key("retry-after"));
    let answer: Value = refused.json().unwrap();
    assert_eq!(error_code(&answer), "server_busy", "{answer}");
    // Once the slow sender is gone, the same body is parsed (and refused for its workflow).
    drop(slow);
    let mut status = 429;
    for _ in 0..100 {
        status = post_raw(&server, "/api/v2/jobs", body.clone()).status().as_u16();
        if status != 429 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(matches!(status, 400 | 422), "status {status} once the budget is free");
    // A body whose parse alone is over the whole budget could never be taken: 413.
    let strings = vec!["\"abcdefghijklmnopqrstuvwxyz01\""; 900_000].join(",");
    let r = post_raw(&server, "/api/v2/jobs", format!("{{\"workflow\": [{strings}]}}"));
    assert_eq!(r.status().as_u16(), 413);
    // Eight large bodies at once: each is parsed or told to retry, and the server stays up.
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (server, body) = (&server, body.clone());
                scope.spawn(move || post_raw(server, "/api/v2/jobs", body).status().as_u16())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|s| matches!(s, 400 | 422 | 429)), "{statuses:?}");
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
}

#[test]
fn concurrent_writes_of_different_comfyui_settings_all_land() {
    let server = Server::start();
    let ids: Vec<String> = (0..24).map(|i| format!("Comfy.Setting{i}")).collect();
    std::thread::scope(|scope| {
        for (i, id) in ids.iter().enumerate() {
            let server = &server;
            scope.spawn(move || {
                let r = server.post(&format!("/settings/{id}"), &json!(i));
                assert_eq!(r.status().as_u16(), 200, "writing {id}");
            });
        }
    });
    let settings: Value = server.get("/settings").json().unwrap();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(settings[id], json!(i), "{id} was lost: {settings}");
    }
}
