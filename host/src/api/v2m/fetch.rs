//! The outbound client for `video` URLs: only hosts the operator allowed, names resolved
//! here and every address checked against internal ranges (SSRF), the connection made to a
//! checked address, TLS verified against the URL's host with built-in roots, no redirects.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_rustls::TlsConnector;
use warp::http::header;
use weft_v2m::{TempVideo, V2mError};

use super::form::{stream_to_temp, too_large};
use super::{DetailError, V2mSettings};

/// How long fetching a video URL may wait for a connection or for response headers.
const URL_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Fetches the video URLs the operator's settings allow.
pub(super) struct UrlFetcher {
    allow_hosts: Vec<String>,
    allow_private: bool,
    tls: TlsConnector,
    timeout: Duration,
}

impl UrlFetcher {
    /// The client for `settings`' allowed hosts; an error when the URL CA file cannot be used.
    pub(super) fn new(settings: &V2mSettings) -> Result<Self, V2mError> {
        Ok(Self {
            allow_hosts: settings.allow_url_hosts.clone(),
            allow_private: settings.allow_private_urls,
            tls: tls_connector(settings.url_ca_file.as_deref())?,
            timeout: settings.url_timeout,
        })
    }

    /// [`UrlFetcher::fetch_unbounded`] within the configured overall time: name lookup,
    /// connection, headers and body together.
    pub(super) async fn fetch(
        &self,
        text: &str,
        temp: TempVideo,
        max: u64,
    ) -> Result<(TempVideo, String), DetailError> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.fetch_unbounded(text, temp, max))
            .await
            .map_err(|_| {
                DetailError::UnsupportedVideo(format!(
                    "fetching the video URL failed: it took longer than {} s",
                    timeout.as_secs_f64()
                ))
            })?
    }

    /// Downloads an allowed `http://` or `https://` URL into `temp`, at most `max` bytes, and
    /// returns it with the hex blake3 of its bytes. The host must be on the operator's list;
    /// its name is resolved here and every address checked, the connection goes to a checked
    /// address (so a second lookup cannot change it), TLS verifies the certificate against the
    /// URL's host name, and redirects are not followed.
    async fn fetch_unbounded(&self, text: &str, temp: TempVideo, max: u64) -> Result<(TempVideo, String), DetailError> {
        let refuse = |m: String| DetailError::InvalidRequest(m);
        let url = url::Url::parse(text).map_err(|_| refuse("`video` is not a valid URL".into()))?;
        let host = url
            .host_str()
            .ok_or_else(|| refuse("the video URL has no host".into()))?
            .trim_matches(|c| c == '[' || c == ']')
            .to_ascii_lowercase();
        let allowed = self
            .allow_hosts
            .iter()
            .any(|h| h.trim_matches(|c| c == '[' || c == ']').eq_ignore_ascii_case(&host));
        if !allowed {
            return Err(refuse(format!("this server does not fetch videos from host {host:?}")));
        }
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(refuse(format!(
                    "video URLs must be http:// or https://, not {other}://"
                )))
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse("video URLs may not carry credentials".into()));
        }
        let port = url.port_or_known_default().unwrap_or(if tls { 443 } else { 80 });
        let addresses: Vec<SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| DetailError::UnsupportedVideo(format!("cannot resolve {name}: {e}")))?
                .collect(),
            None => Vec::new(),
        };
        if addresses.is_empty() {
            return Err(DetailError::UnsupportedVideo(format!("{host} has no address")));
        }
        if !self.allow_private {
            if let Some(bad) = addresses.iter().find(|a| is_internal(a.ip())) {
                return Err(refuse(format!(
                    "{host} resolves to a non-public address ({}); refused",
                    bad.ip()
                )));
            }
        }
        let unreadable = |m: String| DetailError::UnsupportedVideo(format!("fetching the video URL failed: {m}"));
        let authority = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let request = warp::hyper::Request::get(path)
            .header(header::HOST, authority)
            .header(header::USER_AGENT, "weft-v2m")
            .body(warp::hyper::Body::empty())
            .map_err(|e| refuse(format!("bad video URL: {e}")))?;
        let stream = tokio::time::timeout(URL_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&addresses[..]))
            .await
            .map_err(|_| unreadable("connection timed out".into()))?
            .map_err(|e| unreadable(e.to_string()))?;
        let response = if tls {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| refuse(format!("{host:?} is not a name TLS can verify")))?;
            let stream = tokio::time::timeout(URL_CONNECT_TIMEOUT, self.tls.connect(name, stream))
                .await
                .map_err(|_| unreadable("the TLS handshake timed out".into()))?
                .map_err(|e| unreadable(format!("TLS: {e}")))?;
            get_over(stream, request).await
        } else {
            get_over(stream, request).await
        }
        .map_err(unreadable)?;
        if !response.status().is_success() {
            return Err(unreadable(format!("the server answered HTTP {}", response.status())));
        }
        let announced = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if announced.is_some_and(|len| len > max) {
            return Err(too_large(max));
        }
        let chunks = response
            .into_body()
            .map(|r| r.map_err(|e| DetailError::UnsupportedVideo(format!("fetching the video URL failed: {e}"))));
        let (temp, hash, _) = stream_to_temp(temp, chunks, max, false).await?;
        Ok((temp, hash.to_hex().to_string()))
    }
}

/// Whether `ip` is an address a server-side fetch must not reach by default.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1])) // shared address space
                || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
                || (o[0] == 198 && (18..20).contains(&o[1])) // benchmarking
                || o[0] >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64
                || (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0 && s[4] == 0 && s[5] == 0)
            // IPv4-compatible
        }
    }
}

/// Sends `request` as HTTP/1.1 over `stream` and waits for the response headers.
async fn get_over<S>(
    stream: S,
    request: warp::hyper::Request<warp::hyper::Body>,
) -> Result<warp::hyper::Response<warp::hyper::Body>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = warp::hyper::client::conn::handshake(stream)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    tokio::time::timeout(URL_CONNECT_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| "no response".to_string())?
        .map_err(|e| e.to_string())
}

/// TLS for `https://` video URLs: Mozilla's root certificates (built in, so no OS store is
/// needed) plus those in `ca_file`.
fn tls_connector(ca_file: Option<&Path>) -> Result<TlsConnector, V2mError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let bad = |e: String| V2mError::GenerationFailed(format!("the URL CA file {}: {e}", path.display()));
        let mut added = 0;
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
            roots
                .add(cert.map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("no certificates in it".into()));
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| V2mError::GenerationFailed(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "151.101.1.1", "2606:4700::1111"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }
}
