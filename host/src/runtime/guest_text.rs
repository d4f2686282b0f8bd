//! Limits on the text a guest hands the host: progress messages and the messages and
//! tracebacks of node errors. They are stored with the job and served on every read of it
//! (and of the job list, and on the event stream), so each is cut to a fixed size where it
//! enters the host, before anything keeps it. Logs have their own bound (the tail log).

/// Longest progress message kept, in bytes. A progress line is a status, not a report.
pub(crate) const PROGRESS_MESSAGE_BYTES: usize = 1024;

/// Longest node error message kept, in bytes: room for a real explanation.
pub(crate) const ERROR_MESSAGE_BYTES: usize = 8 << 10;

/// Longest traceback kept, in bytes: a few hundred frames.
pub(crate) const TRACEBACK_BYTES: usize = 32 << 10;

/// `text` cut to at most `limit` bytes on a character boundary, ending with a marker that
/// says how long it was, when it is longer.
pub(crate) fn bounded(mut text: String, limit: usize) -> String {
    if text.len() <= limit {
        return text;
    }
    let marker = format!(" [truncated: {} bytes in all]", text.len());
    let mut end = limit.saturating_sub(marker.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&marker);
    text
}

#[cfg(test)]
mod tests {
    use super::bounded;

    #[test]
    fn long_text_is_cut_on_a_character_boundary_with_a_marker() {
        assert_eq!(bounded("short".into(), 64), "short");
        let long = "é".repeat(1000);
        let cut = bounded(long, 64);
        assert!(cut.len() <= 64, "{}", cut.len());
        assert!(cut.ends_with(" [truncated: 2000 bytes in all]"), "{cut}");
        assert!(cut.starts_with('é'));
    }
}
