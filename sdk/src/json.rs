//! The few bits of JSON the SDK writes (input defaults).

/// Values that can be an input's default, written as JSON text.
pub(crate) trait JsonLiteral {
    /// This value as JSON text.
    fn to_json(&self) -> String;
}

impl JsonLiteral for String {
    fn to_json(&self) -> String {
        json_string(self)
    }
}

impl JsonLiteral for bool {
    fn to_json(&self) -> String {
        self.to_string()
    }
}

impl JsonLiteral for i64 {
    fn to_json(&self) -> String {
        self.to_string()
    }
}

impl JsonLiteral for u32 {
    fn to_json(&self) -> String {
        self.to_string()
    }
}

impl JsonLiteral for u64 {
    fn to_json(&self) -> String {
        self.to_string()
    }
}

impl JsonLiteral for f64 {
    fn to_json(&self) -> String {
        if self.is_finite() {
            // `{:?}` keeps a `.0` on whole numbers and uses exponents for huge ones,
            // both valid JSON.
            format!("{self:?}")
        } else {
            "null".to_string()
        }
    }
}

/// `s` as a JSON string literal.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_strings() {
        assert_eq!(json_string("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\u0001é""#);
    }

    #[test]
    fn numbers() {
        assert_eq!(1.0f64.to_json(), "1.0");
        assert_eq!(0.1f64.to_json(), "0.1");
        assert_eq!(f64::NAN.to_json(), "null");
        assert_eq!((-5i64).to_json(), "-5");
        assert_eq!(true.to_json(), "true");
    }
}
