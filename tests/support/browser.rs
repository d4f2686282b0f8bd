//! Headless Chromium for the browser tests: starts Debian's `chromedriver` on a free port
//! and drives `chromium` through it with `fantoccini` (WebDriver over loopback HTTP). The
//! calls are blocking wrappers, so a test mixes them freely with the blocking HTTP client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// Where `scripts/setup.sh` installs them (Debian's `chromium` and `chromium-driver`).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless browser session; the driver is killed on drop.
pub(crate) struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
    driver: Child,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (1280×900 window).
    pub(crate) fn start() -> Browser {
        for tool in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: run scripts/setup.sh --with-tests (it installs chromium and chromium-driver)"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut browser = Browser {
            runtime,
            client: None,
            driver,
        };
        let url = format!("http://127.0.0.1:{port}");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--no-first-run", "--disable-extensions"]
            }
        });
        let capabilities = capabilities.as_object().unwrap().clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let attempt = browser.runtime.block_on(
                ClientBuilder::new(connector)
                    .capabilities(capabilities.clone())
                    .connect(&url),
            );
            match attempt {
                Ok(client) => break client,
                Err(e) if Instant::now() > deadline => panic!("chromedriver never opened a session: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        browser.client = Some(client);
        browser
    }

    fn client(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    /// Opens `url`.
    pub(crate) fn goto(&self, url: &str) {
        self.runtime.block_on(self.client().goto(url)).unwrap();
    }

    /// The address shown now.
    pub(crate) fn url(&self) -> String {
        self.runtime.block_on(self.client().current_url()).unwrap().to_string()
    }

    /// Runs `script` in the page and returns its value.
    pub(crate) fn eval(&self, script: &str) -> Value {
        self.runtime.block_on(self.client().execute(script, vec![])).unwrap()
    }

    /// Types `text` into the element matching `css`.
    pub(crate) fn type_into(&self, css: &str, text: &str) {
        let element = self.runtime.block_on(self.client().find(Locator::Css(css))).unwrap();
        self.runtime.block_on(element.send_keys(text)).unwrap();
    }

    /// Sets the value of the form field matching `css` (faster than typing long text).
    pub(crate) fn set_value(&self, css: &str, value: &str) {
        let element = self.runtime.block_on(self.client().find(Locator::Css(css))).unwrap();
        let element = serde_json::to_value(element).unwrap();
        self.runtime
            .block_on(self.client().execute(
                "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));",
                vec![element, json!(value)],
            ))
            .unwrap();
    }

    /// Clicks the element matching `css`.
    pub(crate) fn click(&self, css: &str) {
        let element = self.runtime.block_on(self.client().find(Locator::Css(css))).unwrap();
        self.runtime.block_on(element.click()).unwrap();
    }

    /// The text of the element matching `css`, if there is one.
    pub(crate) fn text(&self, css: &str) -> Option<String> {
        let element = self.runtime.block_on(self.client().find(Locator::Css(css))).ok()?;
        self.runtime.block_on(element.text()).ok()
    }

    /// Waits (up to `secs`) until `script` returns `true`; panics with `what` otherwise.
    pub(crate) fn wait_for(&self, secs: u64, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if self.eval(script) == Value::Bool(true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {what}; page text: {:?}",
            self.eval("return document.body.innerText")
        );
    }

    /// Saves a screenshot of the window as `dir/name.png`, checks it is not blank (more than
    /// a handful of colours), and returns its path.
    pub(crate) fn screenshot(&self, dir: &Path, name: &str) -> PathBuf {
        let png = self.runtime.block_on(self.client().screenshot()).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, &png).unwrap();
        let image = image::load_from_memory(&png).unwrap().to_rgb8();
        let colours: std::collections::HashSet<[u8; 3]> = image.pixels().map(|p| p.0).collect();
        assert!(
            colours.len() > 8,
            "screenshot {name} is blank ({} colours)",
            colours.len()
        );
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = self.runtime.block_on(client.close());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
