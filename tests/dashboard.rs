//! The web dashboard, in headless Chromium (Debian's `chromium` through `chromedriver`) and
//! over plain HTTP: login and the session cookie, submitting from the page and watching the
//! job finish live, outputs inline, cancel, escaping, tenant isolation and the CSRF guard.
//! Every page visited is screenshotted into the test's temp dir and checked not blank.

mod support;

use serde_json::{json, Value};
use support::browser::Browser;
use support::{new_key, plugins_with, raw_client, session_cookie, Options, Server};

fn image_graph() -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 3368652}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "dash"}}
    })
}

fn log_in(browser: &Browser, server: &Server, key: &str) {
    browser.goto(&server.url("/login"));
    browser.type_into("#key", key);
    browser.click("#login");
    browser.wait_for(
        20,
        "the jobs page after login",
        "return document.body.dataset.page === 'jobs'",
    );
}

#[test]
fn login_then_submit_the_image_graph_from_the_page_and_watch_it_succeed_live() {
    let server = Server::with(Options {
        args: vec![
            "--token".into(),
            "secret-token".into(),
            "--admin-token".into(),
            "operator-token".into(),
        ],
        token: Some("secret-token".into()),
        ..Default::default()
    });
    let shots = tempfile::tempdir().unwrap();
    let browser = Browser::start();

    // A page needs a session: the browser is sent to log in, and comes back after.
    browser.goto(&server.url("/ui/nodes"));
    assert!(
        browser.url().contains("/login?next="),
        "not sent to log in: {}",
        browser.url()
    );
    browser.screenshot(shots.path(), "login");
    browser.type_into("#key", "wrong");
    browser.click("#login");
    browser.wait_for(10, "the login error", "return !!document.getElementById('login-error')");
    browser.type_into("#key", "secret-token");
    browser.click("#login");
    browser.wait_for(20, "the nodes page", "return document.body.dataset.page === 'nodes'");
    assert!(
        browser
            .eval("return document.querySelectorAll('#node-list .node').length")
            .as_u64()
            .unwrap()
            > 10
    );
    browser.set_value("#node-search", "imageinvert");
    browser.wait_for(
        10,
        "the search to filter",
        "return [...document.querySelectorAll('#node-list .node')].filter(n => !n.hidden).length === 1",
    );
    browser.screenshot(shots.path(), "nodes");

    // The jobs list is open, and follows the feed.
    browser.goto(&server.url("/"));
    browser.wait_for(10, "the jobs page", "return document.body.dataset.page === 'jobs'");
    let listed = server.submit(image_graph());
    let listed_id = listed["id"].as_str().unwrap().to_string();
    browser.wait_for(
        30,
        "the job submitted elsewhere to show up as succeeded without a reload",
        &format!("const r = document.querySelector('tr[data-job=\"{listed_id}\"] .status'); return !!r && r.textContent === 'succeeded'"),
    );
    let shot = browser.screenshot(shots.path(), "jobs");
    if let Ok(dest) = std::env::var("WEFT_DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, dest).unwrap();
    }

    // Submit from the page: paste, build the form from the catalogue, edit, queue.
    browser.goto(&server.url("/ui/submit"));
    browser.set_value("#workflow", &serde_json::to_string_pretty(&image_graph()).unwrap());
    browser.click("#load");
    browser.wait_for(
        10,
        "the generated form",
        "return !!document.querySelector('#form input[data-node=\"1\"][data-input=\"width\"]')",
    );
    browser.eval(
        "const w = document.querySelector('#form input[data-node=\"1\"][data-input=\"width\"]'); \
         w.value = '48'; w.dispatchEvent(new Event('change')); return true",
    );
    assert_eq!(
        browser.eval("return JSON.parse(document.getElementById('workflow').value)['1'].inputs.width"),
        json!(48)
    );
    browser.screenshot(shots.path(), "submit");
    browser.click("#queue");
    browser.wait_for(20, "the job page", "return document.body.dataset.page === 'job'");
    browser.wait_for(
        60,
        "the job to reach succeeded without a reload",
        "const s = document.querySelector('#job-status .status'); return !!s && s.textContent === 'succeeded'",
    );
    browser.wait_for(
        20,
        "the output image inline",
        "const i = document.querySelector('#outputs img'); return !!i && i.complete && i.naturalWidth === 48",
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('#outputs a[download]').length"),
        json!(1)
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('#nodes tbody tr').length"),
        json!(3)
    );
    browser.screenshot(shots.path(), "job");

    // The operator page is the operator's: a tenant session is told so.
    browser.goto(&server.url("/ui/operator"));
    assert!(browser.text("#page-error").unwrap().contains("operator token"));
    browser.click(".logout button");
    browser.wait_for(10, "the login page", "return document.body.dataset.page === 'login'");
    browser.goto(&server.url("/login?next=/ui/operator"));
    browser.type_into("#key", "operator-token");
    browser.click("#login");
    browser.wait_for(20, "the operator page", "return !!document.getElementById('figures')");
    assert_eq!(browser.text("#workers").unwrap(), "4");
    assert!(browser.text("#plugins").unwrap().contains("core"));
    browser.screenshot(shots.path(), "operator");
}

#[test]
fn cancel_a_slow_job_from_its_page() {
    let (server, _plugins) = support::slow_server(&[]);
    let shots = tempfile::tempdir().unwrap();
    let job = server.submit(support::slow_workflow(120.0));
    let id = job["id"].as_str().unwrap();
    support::wait_running(&server, id);
    let browser = Browser::start();
    browser.goto(&server.url(&format!("/ui/jobs/{id}")));
    browser.wait_for(
        20,
        "live progress",
        "return document.getElementById('overall').value > 0 || document.getElementById('steps-text').textContent !== ''",
    );
    browser.click("#cancel");
    browser.wait_for(
        60,
        "the job to be canceled",
        "const s = document.querySelector('#job-status .status'); return !!s && s.textContent === 'canceled'",
    );
    browser.screenshot(shots.path(), "canceled");
    assert_eq!(server.wait(id)["status"], "canceled");
}

#[test]
fn a_job_log_with_markup_shows_as_text() {
    let plugins = plugins_with(&["weft_test_loud"]);
    let server = Server::with(Options {
        args: vec![
            "--surface".into(),
            "serverless".into(),
            "--initial-credits".into(),
            "100".into(),
        ],
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    let shots = tempfile::tempdir().unwrap();
    let job = server.run(json!({
        "1": {"class_type": "HostileLogMarkup", "inputs": {"text": "<script>document.title='pwned'</script>"}},
        "2": {"class_type": "HostileFileName", "inputs": {
            "content": "<script>alert1 = 1</script>", "extension": "html", "content_type": "text/html"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let id = job["id"].as_str().unwrap();
    let browser = Browser::start();
    browser.goto(&server.url(&format!("/ui/jobs/{id}")));
    browser.wait_for(
        20,
        "the html output shown as text",
        "const p = document.querySelector('#outputs pre'); return !!p && p.textContent.includes('<script>')",
    );
    let log = browser.text("#logs").unwrap();
    assert!(log.contains("<script>document.title='pwned'</script>"), "log: {log:?}");
    assert_eq!(
        browser.eval("return document.querySelectorAll('script').length"),
        json!(1)
    );
    assert_ne!(browser.eval("return document.title"), json!("pwned"));
    assert_eq!(browser.eval("return typeof alert1"), json!("undefined"));
    browser.screenshot(shots.path(), "log");
}

#[test]
fn one_tenant_cannot_open_another_tenants_job_page() {
    let data = tempfile::tempdir().unwrap();
    let alice = new_key(data.path(), "alice");
    let bob = new_key(data.path(), "bob");
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into()],
        data_dir: Some(data.path().to_path_buf()),
        token: Some(alice.clone()),
        ..Default::default()
    });
    let shots = tempfile::tempdir().unwrap();
    let job = server.run(image_graph());
    let id = job["id"].as_str().unwrap();
    let browser = Browser::start();
    log_in(&browser, &server, &bob);
    browser.goto(&server.url(&format!("/ui/jobs/{id}")));
    assert!(browser.text("#page-error").unwrap().contains("no such job"));
    assert_eq!(
        browser.eval("return document.querySelectorAll('#outputs, #job').length"),
        json!(0)
    );
    browser.goto(&server.url("/"));
    assert_eq!(
        browser.eval("return document.querySelectorAll('#jobs tbody tr').length"),
        json!(0)
    );
    browser.screenshot(shots.path(), "bob-jobs");
    // Over HTTP too: Bob's session gets a 404 for Alice's job, Alice's gets the page.
    let bob_cookie = session_cookie(&server, &bob);
    let r = raw_client()
        .get(server.url(&format!("/ui/jobs/{id}")))
        .header("Cookie", &bob_cookie)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let alice_cookie = session_cookie(&server, &alice);
    let r = raw_client()
        .get(server.url(&format!("/ui/jobs/{id}")))
        .header("Cookie", &alice_cookie)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn a_cross_site_request_on_the_session_cookie_is_refused() {
    let server = Server::with(Options {
        args: vec!["--token".into(), "secret-token".into()],
        token: Some("secret-token".into()),
        ..Default::default()
    });
    let client = raw_client();
    let cookie = session_cookie(&server, "secret-token");
    let body = json!({"workflow": image_graph()});
    let post = |headers: &[(&str, &str)]| {
        let mut rb = client
            .post(server.url("/api/v2/jobs"))
            .header("Cookie", &cookie)
            .json(&body);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        rb.send().unwrap().status().as_u16()
    };
    assert_eq!(post(&[]), 403, "no origin information");
    assert_eq!(post(&[("Origin", "https://evil.example")]), 403);
    assert_eq!(post(&[("Sec-Fetch-Site", "cross-site")]), 403);
    assert_eq!(post(&[("Sec-Fetch-Site", "same-origin")]), 201);
    assert_eq!(post(&[("Origin", &server.base)]), 201);
    // Reads need no origin; a bearer request is unaffected by the guard.
    let r = client
        .get(server.url("/api/v2/jobs"))
        .header("Cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client
        .post(server.url("/api/v2/jobs"))
        .bearer_auth("secret-token")
        .header("Origin", "https://evil.example")
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    // A forged cookie is no session.
    let r = client
        .get(server.url("/api/v2/jobs"))
        .header("Cookie", "weft_session=0123456789abcdef")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // A cross-site login or logout is refused; a login never redirects off the server.
    let r = client
        .post(server.url("/login"))
        .header("Origin", "https://evil.example")
        .form(&[("key", "secret-token")])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = client
        .post(server.url("/login"))
        .header("Origin", &server.base)
        .form(&[("key", "secret-token"), ("next", "//evil.example/x")])
        .send()
        .unwrap();
    assert_eq!(r.headers()["location"], "/");
    // Logout ends the session.
    let r = client
        .post(server.url("/logout"))
        .header("Cookie", &cookie)
        .header("Origin", &server.base)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let r = client
        .get(server.url("/api/v2/jobs"))
        .header("Cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client.get(server.url("/")).header("Cookie", &cookie).send().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    // Every page carries the strict policy.
    let r = client.get(server.url("/login")).send().unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
}

#[test]
fn login_attempts_from_one_client_are_rate_limited_with_retry_after() {
    let server = Server::with(Options {
        args: vec!["--token".into(), "secret-token".into()],
        token: Some("secret-token".into()),
        ..Default::default()
    });
    let client = raw_client();
    let attempt = |key: &str| {
        client
            .post(server.url("/login"))
            .header("Origin", &server.base)
            .form(&[("key", key), ("next", "/")])
            .send()
            .unwrap()
    };
    // The first attempts are judged on the key; guessing on is then refused.
    let statuses: Vec<u16> = (0..40)
        .map(|i| attempt(&format!("guess-{i}")).status().as_u16())
        .collect();
    assert_eq!(statuses[0], 401, "{statuses:?}");
    let limited = attempt("secret-token");
    assert_eq!(limited.status().as_u16(), 429, "after {statuses:?}");
    let wait: u64 = limited.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait >= 1, "retry-after {wait}");
    assert!(limited.text().unwrap().contains("Too many login attempts"));
    // The job API's bearer auth is not affected.
    let r = client
        .get(server.url("/api/v2/jobs"))
        .bearer_auth("secret-token")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// The job ids a jobs page lists, newest first, and its "Older jobs" link.
fn listed(page: &str) -> (Vec<String>, Option<String>) {
    let ids = page
        .split("<tr data-job=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect();
    let older = page
        .split("id=\"older\" href=\"")
        .nth(1)
        .map(|rest| rest.split('"').next().unwrap().replace("&amp;", "&"));
    (ids, older)
}

#[test]
fn the_jobs_list_pages_by_cursor_and_filters_by_status_and_label() {
    let server = Server::start();
    let client = raw_client();
    let page = |path: &str| {
        let r = client.get(server.url(path)).send().unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        r.text().unwrap()
    };
    // 60 jobs, oldest first; every third is labelled; job 59 fails (text is no image).
    let text = server.upload("not-an-image.png", b"plain text".to_vec());
    let mut ids = Vec::new();
    for i in 0..60 {
        let mut body = json!({"workflow": image_graph()});
        body["workflow"]["1"]["inputs"]["color"] = json!(i);
        if i % 3 == 0 {
            body["metadata"] = json!({"team": "red"});
        }
        if i == 59 {
            body["workflow"] = json!({
                "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": text["id"]}}}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}
            });
        }
        let r = server.post("/api/v2/jobs", &body);
        assert_eq!(r.status().as_u16(), 201);
        let job: Value = r.json().unwrap();
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        server.wait(id);
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    let (first, older) = listed(&page("/"));
    assert_eq!(first, newest_first[..50], "the newest 50 first");
    let (second, none) = listed(&page(&older.expect("an Older jobs link")));
    assert_eq!(second, newest_first[50..], "then the rest");
    assert_eq!(none, None, "the last page has no Older link");

    let (failed, _) = listed(&page("/?status=failed"));
    assert_eq!(failed, [ids[59].clone()]);
    let (succeeded, _) = listed(&page("/?status=succeeded"));
    assert!(!succeeded.contains(&ids[59]) && succeeded.len() == 50);

    let red: Vec<String> = newest_first
        .iter()
        .filter(|id| ids.iter().position(|x| x == *id).unwrap() % 3 == 0)
        .cloned()
        .collect();
    let (labelled, older) = listed(&page("/?label=team%3Dred"));
    assert_eq!(labelled, red, "every labelled job, on one page");
    assert_eq!(older, None);
    let (nobody, _) = listed(&page("/?label=team%3Dblue"));
    assert!(nobody.is_empty());

    for bad in ["/?cursor=zzz", "/?label=no-equals-sign", "/?status=sleeping"] {
        let r = client.get(server.url(bad)).send().unwrap();
        assert_eq!(r.status().as_u16(), 400, "{bad}");
        let text = r.text().unwrap();
        assert!(!text.contains("<script>"), "{bad}: an error page, escaped");
    }
}

/// The state and time cells of node `id`'s row on a job page.
fn node_cells(page: &str, id: &str) -> (String, String) {
    let row = page
        .split(&format!("<tr data-node=\"{id}\">"))
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("no row for node {id}"));
    let cell = |class: &str| {
        row.split(&format!("class=\"{class}\">"))
            .nth(1)
            .and_then(|rest| rest.split("</td>").next())
            .unwrap_or("")
            .to_string()
    };
    (cell("node-state"), cell("node-time"))
}

#[test]
fn a_finished_jobs_page_shows_each_nodes_time_as_the_server_measured_it() {
    let server = Server::start();
    let client = raw_client();
    let page = |id: &str| {
        client
            .get(server.url(&format!("/ui/jobs/{id}")))
            .send()
            .unwrap()
            .text()
            .unwrap()
    };
    let first = server.run(image_graph());
    let id = first["id"].as_str().unwrap();
    let shown = page(id);
    for node in ["1", "2", "3"] {
        let (state, time) = node_cells(&shown, node);
        assert_eq!(state, "done", "node {node}");
        assert!(time.ends_with(" ms") || time.ends_with(" s"), "node {node}: {time:?}");
    }
    // The same graph again comes from the node cache.
    let again = server.run(image_graph());
    let shown = page(again["id"].as_str().unwrap());
    assert_eq!(node_cells(&shown, "3").0, "cached");
    // A failing node is marked; nodes after it never ran and show nothing.
    let text = server.upload("not-an-image.png", b"plain text".to_vec());
    let broken = server.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": text["id"]}}}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}}
    }));
    assert_eq!(broken["status"], "failed");
    let shown = page(broken["id"].as_str().unwrap());
    assert_eq!(node_cells(&shown, "1").0, "failed");
    assert_eq!(node_cells(&shown, "3"), (String::new(), String::new()));
}
