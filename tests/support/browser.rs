//! Headless Debian `chromium` driven through `chromedriver` with fantoccini.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A browser session; its chromedriver is killed on drop.
pub(crate) struct Browser {
    /// The WebDriver client.
    pub client: fantoccini::Client,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Starts chromedriver (`CHROMEDRIVER`, else `chromedriver`) on a free port and opens a
/// headless chromium (`CHROMIUM`, else `/usr/bin/chromium`) window of 1280x800.
pub(crate) async fn open() -> Browser {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let driver = Command::new(std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into()))
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromedriver (apt-get install chromium-driver)");
    let binary = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({"binary": binary, "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"]}),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        match fantoccini::ClientBuilder::new(hyper_connector())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => break client,
            Err(e) if Instant::now() > deadline => panic!("chromedriver did not start: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    Browser { client, driver }
}

fn hyper_connector() -> hyper_util::client::legacy::connect::HttpConnector {
    hyper_util::client::legacy::connect::HttpConnector::new()
}
