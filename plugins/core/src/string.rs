//! ComfyUI's string nodes (`comfy_extras/nodes_string.py`).

use regex::{Regex, RegexBuilder};
use weft_sdk::NodeError;

use crate::strings::{py_capitalize, py_is_space, py_slice, py_title};

weft_sdk::node! {
    /// Joins two strings with a delimiter.
    pub struct StringConcatenate {
        display_name: "Concatenate",
        category: "utils/string",
        inputs {
            string_a: String = input::string().multiline(),
            string_b: String = input::string().multiline(),
            delimiter: String = input::string().default(""),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Ok((format!("{}{}{}", inp.string_a, inp.delimiter, inp.string_b),))
        }
    }
}

weft_sdk::node! {
    /// The characters from `start` up to `end`, as Python slices them (negative
    /// positions count from the end).
    pub struct StringSubstring {
        display_name: "Substring",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            start: i64 = input::int(),
            end: i64 = input::int(),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Ok((py_slice(&inp.string, inp.start, inp.end),))
        }
    }
}

weft_sdk::node! {
    /// The number of characters in the string.
    pub struct StringLength {
        display_name: "Length",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
        }
        outputs { length: i64 }
        fn execute(_, inp) {
            Ok((inp.string.chars().count() as i64,))
        }
    }
}

weft_sdk::node! {
    /// Changes the case of the string.
    pub struct CaseConverter {
        display_name: "Case Converter",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            mode: String = input::combo(["UPPERCASE", "lowercase", "Capitalize", "Title Case"]),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            let s = inp.string;
            let result = match inp.mode.as_str() {
                "UPPERCASE" => s.to_uppercase(),
                "lowercase" => s.to_lowercase(),
                "Capitalize" => py_capitalize(&s),
                "Title Case" => py_title(&s),
                _ => s,
            };
            Ok((result,))
        }
    }
}

weft_sdk::node! {
    /// Removes whitespace from both ends, the left or the right of the string.
    pub struct StringTrim {
        display_name: "Trim",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            mode: String = input::combo(["Both", "Left", "Right"]),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            let s = inp.string.as_str();
            let result = match inp.mode.as_str() {
                "Both" => s.trim_matches(py_is_space),
                "Left" => s.trim_start_matches(py_is_space),
                "Right" => s.trim_end_matches(py_is_space),
                _ => s,
            };
            Ok((result.to_string(),))
        }
    }
}

weft_sdk::node! {
    /// Replaces every occurrence of `find` with `replace`.
    pub struct StringReplace {
        display_name: "Replace",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            find: String = input::string().multiline(),
            replace: String = input::string().multiline(),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Ok((inp.string.replace(&inp.find, &inp.replace),))
        }
    }
}

weft_sdk::node! {
    /// Whether the string contains the substring.
    pub struct StringContains {
        display_name: "Contains",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            substring: String = input::string().multiline(),
            case_sensitive: bool = input::boolean().default(true),
        }
        outputs { contains: bool }
        fn execute(_, inp) {
            let contains = if inp.case_sensitive {
                inp.string.contains(&inp.substring)
            } else {
                inp.string.to_lowercase().contains(&inp.substring.to_lowercase())
            };
            Ok((contains,))
        }
    }
}

weft_sdk::node! {
    /// Compares two strings: starts with, ends with, or equal.
    pub struct StringCompare {
        display_name: "Compare",
        category: "utils/string",
        inputs {
            string_a: String = input::string().multiline(),
            string_b: String = input::string().multiline(),
            mode: String = input::combo(["Starts With", "Ends With", "Equal"]),
            case_sensitive: bool = input::boolean().default(true),
        }
        outputs { BOOLEAN: bool }
        fn execute(_, inp) {
            let (a, b) = if inp.case_sensitive {
                (inp.string_a, inp.string_b)
            } else {
                (inp.string_a.to_lowercase(), inp.string_b.to_lowercase())
            };
            let result = match inp.mode.as_str() {
                "Starts With" => a.starts_with(&b),
                "Ends With" => a.ends_with(&b),
                _ => a == b,
            };
            Ok((result,))
        }
    }
}

/// Compiles `pattern` with ComfyUI's regex flags; an invalid pattern is an
/// `invalid_regex` node error.
fn build_regex(pattern: &str, case_insensitive: bool, multiline: bool, dotall: bool) -> Result<Regex, NodeError> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .multi_line(multiline)
        .dot_matches_new_line(dotall)
        .build()
        .map_err(|e| NodeError::new("invalid_regex", format!("invalid regex `{pattern}`: {e}")))
}

weft_sdk::node! {
    /// Whether the regex matches anywhere in the string.
    pub struct RegexMatch {
        display_name: "Regex Match",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            regex_pattern: String = input::string().multiline(),
            case_insensitive: bool = input::boolean().default(true),
            multiline: bool = input::boolean().default(false),
            dotall: bool = input::boolean().default(false),
        }
        outputs { matches: bool }
        fn execute(_, inp) {
            let re = build_regex(&inp.regex_pattern, inp.case_insensitive, inp.multiline, inp.dotall)?;
            Ok((re.is_match(&inp.string),))
        }
    }
}

/// `RegexExtract`'s modes, as Python's `re` module would answer them.
fn extract(re: &Regex, string: &str, mode: &str, group_index: usize) -> String {
    let groups = re.captures_len() - 1;
    let group = |c: &regex::Captures<'_>, i: usize| c.get(i).map_or(String::new(), |m| m.as_str().to_string());
    match mode {
        "First Match" => re.find(string).map_or(String::new(), |m| m.as_str().to_string()),
        "All Matches" => {
            // `re.findall`: the whole match without groups, the first group with them.
            let index = usize::from(groups > 0);
            re.captures_iter(string)
                .map(|c| group(&c, index))
                .collect::<Vec<_>>()
                .join("\n")
        }
        "First Group" => match re.captures(string) {
            Some(c) if groups >= group_index => group(&c, group_index),
            _ => String::new(),
        },
        "All Groups" => {
            if groups == 0 || groups < group_index {
                return String::new();
            }
            re.captures_iter(string)
                .map(|c| group(&c, group_index))
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => String::new(),
    }
}

weft_sdk::node! {
    /// Extracts the first match, all matches, the first group or all groups of a regex.
    pub struct RegexExtract {
        display_name: "Regex Extract",
        category: "utils/string",
        inputs {
            string: String = input::string().multiline(),
            regex_pattern: String = input::string().multiline(),
            mode: String = input::combo(["First Match", "All Matches", "First Group", "All Groups"]),
            case_insensitive: bool = input::boolean().default(true),
            multiline: bool = input::boolean().default(false),
            dotall: bool = input::boolean().default(false),
            group_index: i64 = input::int().default(1).min(0).max(100),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            let re = build_regex(&inp.regex_pattern, inp.case_insensitive, inp.multiline, inp.dotall)?;
            let group_index = usize::try_from(inp.group_index)?;
            Ok((extract(&re, &inp.string, &inp.mode, group_index),))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> Regex {
        build_regex(p, true, false, false).unwrap()
    }

    #[test]
    fn extract_modes() {
        let s = "a1 b22 c333";
        assert_eq!(extract(&re(r"[a-z]\d+"), s, "First Match", 1), "a1");
        assert_eq!(extract(&re(r"[a-z]\d+"), s, "All Matches", 1), "a1\nb22\nc333");
        assert_eq!(extract(&re(r"([a-z])(\d+)"), s, "All Matches", 1), "a\nb\nc");
        assert_eq!(extract(&re(r"([a-z])(\d+)"), s, "First Group", 2), "1");
        assert_eq!(extract(&re(r"([a-z])(\d+)"), s, "First Group", 3), "");
        assert_eq!(extract(&re(r"([a-z])(\d+)"), s, "All Groups", 2), "1\n22\n333");
        assert_eq!(extract(&re(r"[a-z]\d+"), s, "All Groups", 0), "");
        assert_eq!(extract(&re(r"X"), s, "First Match", 1), "");
    }

    #[test]
    fn invalid_regex_is_a_node_error() {
        let e = build_regex("(", true, false, false).unwrap_err();
        assert_eq!(e.code, "invalid_regex");
    }
}
