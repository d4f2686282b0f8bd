//! Python `str` semantics that ComfyUI's string nodes rely on.

/// Python's `s[start:end]` on code points (negative indices count from the end).
pub fn py_slice(s: &str, start: i64, end: i64) -> String {
    let chars: Vec<char> = s.chars().collect();
    let n = chars.len() as i64;
    let clamp = |i: i64| -> usize {
        let i = if i < 0 { (i + n).max(0) } else { i.min(n) };
        i as usize
    };
    let (a, b) = (clamp(start), clamp(end));
    if a >= b {
        String::new()
    } else {
        chars[a..b].iter().collect()
    }
}

/// Python's `str.isspace` for one character.
pub fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn is_cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase()
}

/// Python's `str.capitalize`: first character upper, the rest lower.
pub fn py_capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect(),
        None => String::new(),
    }
}

/// Python's `str.title`: upper after a non-cased character, lower after a cased one.
pub fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for c in s.chars() {
        if previous_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        previous_cased = is_cased(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_like_python() {
        assert_eq!(py_slice("hello", 1, 3), "el");
        assert_eq!(py_slice("hello", -3, 5), "llo");
        assert_eq!(py_slice("hello", 0, -1), "hell");
        assert_eq!(py_slice("hello", 3, 1), "");
        assert_eq!(py_slice("hello", -10, 100), "hello");
        assert_eq!(py_slice("héllo", 1, 2), "é");
    }

    #[test]
    fn cases_like_python() {
        assert_eq!(py_capitalize("hELLO wORLD"), "Hello world");
        assert_eq!(py_title("they're bill's 1st"), "They'Re Bill'S 1St");
        assert_eq!(py_title("hello world"), "Hello World");
    }

    #[test]
    fn whitespace_like_python() {
        assert!(py_is_space('\u{1f}'));
        assert!(py_is_space('\u{a0}'));
        assert!(!py_is_space('x'));
    }
}
