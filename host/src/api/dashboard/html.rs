//! HTML building: escaping and the page frame.

use std::fmt::Write;

/// `text` escaped for HTML text and double-quoted attribute values.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The navigation entries: path, label.
const NAV: [(&str, &str); 4] = [
    ("/", "Jobs"),
    ("/ui/submit", "Submit"),
    ("/ui/nodes", "Nodes"),
    ("/ui/operator", "Operators"),
];

/// A whole page: `body` (already escaped HTML) in the frame, with the navigation, the
/// logout button when `logout` is set, and `data-api` naming the job API's base.
pub(super) fn page(title: &str, page: &str, api_base: &str, logout: bool, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · weft</title><link rel=\"stylesheet\" href=\"/ui/static/dashboard.css\">\
         <script src=\"/ui/static/dashboard.js\" defer></script></head>\
         <body data-page=\"{}\" data-api=\"{}\"><header><a class=\"brand\" href=\"/\">weft</a><nav>",
        esc(title),
        esc(page),
        esc(api_base)
    );
    for (path, label) in NAV {
        let _ = write!(out, "<a href=\"{path}\">{label}</a>");
    }
    out.push_str("</nav>");
    if logout {
        out.push_str(
            "<form method=\"post\" action=\"/logout\" class=\"logout\"><button type=\"submit\">Log out</button></form>",
        );
    }
    out.push_str("</header><main>");
    out.push_str(body);
    out.push_str("</main></body></html>");
    out
}

/// An HTML response with `status`.
pub(super) fn response(status: warp::http::StatusCode, html: String) -> warp::reply::Response {
    use warp::Reply;
    warp::reply::with_status(warp::reply::html(html), status).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            esc("<script>a='1'&\"</script>"),
            "&lt;script&gt;a=&#39;1&#39;&amp;&quot;&lt;/script&gt;"
        );
    }
}
