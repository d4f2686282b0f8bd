//! `HostileEscape`: tries to reach outside the sandbox.

use std::io::ErrorKind;
use std::net::TcpStream;

use weft_sdk::NodeError;

/// Every attempt, and what came of it.
#[derive(Default)]
struct Report {
    denied: Vec<String>,
    leaked: Vec<String>,
}

impl Report {
    fn denied(&mut self, what: &str, why: impl std::fmt::Display) {
        self.denied.push(format!("{what}: denied ({why})"));
    }

    fn leaked(&mut self, what: &str, how: impl std::fmt::Display) {
        self.leaked.push(format!("{what}: LEAKED ({how})"));
    }
}

fn try_files(r: &mut Report) {
    match std::fs::read("/etc/passwd") {
        Ok(bytes) => r.leaked("read /etc/passwd", format!("{} bytes", bytes.len())),
        Err(e) => r.denied("read /etc/passwd", e),
    }
    match std::fs::File::open(".") {
        Ok(_) => r.leaked("open .", "opened"),
        Err(e) => r.denied("open .", e),
    }
    match std::fs::read_dir(".") {
        Ok(entries) => r.leaked("list .", format!("{} entries", entries.count())),
        Err(e) => r.denied("list .", e),
    }
    match std::fs::write("weft-escape.txt", b"escaped") {
        Ok(()) => r.leaked("create weft-escape.txt", "written"),
        Err(e) => r.denied("create weft-escape.txt", e),
    }
}

fn try_network(r: &mut Report, address: &str) {
    let what = format!("tcp connect {address}");
    match TcpStream::connect(address) {
        Ok(_) => r.leaked(&what, "connected"),
        // These mean a packet got out: the network is reachable even if nobody answered.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset | ErrorKind::TimedOut
            ) =>
        {
            r.leaked(&what, format!("network reachable: {e}"))
        }
        Err(e) => r.denied(&what, e),
    }
}

fn try_env(r: &mut Report) {
    let names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        r.denied("std::env::vars", "0 variables");
    } else {
        r.leaked(
            "std::env::vars",
            format!("{} variables: {}", names.len(), names.join(",")),
        );
    }
    for var in ["HOME", "PATH"] {
        match std::env::var(var) {
            Ok(v) => r.leaked(&format!("env {var}"), format!("{} bytes", v.len())),
            Err(e) => r.denied(&format!("env {var}"), e),
        }
    }
    match std::env::current_dir() {
        Ok(dir) => r.denied("current_dir", format!("{} (no access implied)", dir.display())),
        Err(e) => r.denied("current_dir", e),
    }
}

weft_sdk::node! {
    /// Tries to read `/etc/passwd`, open, list and write in `.`, connect over TCP to
    /// `address`, and read environment variables. If every attempt was denied, fails
    /// with code `sandbox_held` and a message listing each attempt and its error; if
    /// anything got through, succeeds with a STRING starting `LEAKED:` that lists what.
    pub struct HostileEscape {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            address: String = input::string().default("127.0.0.1:80"),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            let mut r = Report::default();
            try_files(&mut r);
            try_network(&mut r, &inp.address);
            try_env(&mut r);
            if r.leaked.is_empty() {
                Err(NodeError::new("sandbox_held", r.denied.join("; ")))
            } else {
                Ok((format!("LEAKED: {}; also tried: {}", r.leaked.join("; "), r.denied.join("; ")),))
            }
        }
    }
}

weft_sdk::export_plugin!(HostileEscape);
