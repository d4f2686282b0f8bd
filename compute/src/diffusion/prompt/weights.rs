//! ComfyUI's prompt weighting (`comfy/sd1_clip.py`: `escape_important`, `parse_parentheses`,
//! `token_weights`): a parenthesised part is weighted 1.1 times its surroundings, or by the
//! number after its last `:` (`(word:1.3)`), nested weights multiply, and `\(` / `\)` are
//! literal parentheses. Square brackets are ordinary text, as in ComfyUI (A1111 de-weights
//! them; ComfyUI does not). Unbalanced parentheses are read the way ComfyUI reads them, and
//! nothing panics.

/// The private stand-ins for escaped parentheses while the text is parsed (ComfyUI's).
const ESCAPED_CLOSE: &str = "\0\u{1}";
const ESCAPED_OPEN: &str = "\0\u{2}";

/// The weight a bare pair of parentheses multiplies by.
const EMPHASIS: f64 = 1.1;

/// Deepest nesting of weighted groups read (ComfyUI's recursion fails near 1000 levels).
pub(crate) const MAX_NESTING: usize = 256;

/// `text` split into segments with their weights, escapes already turned back into
/// parentheses (`token_weights(escape_important(text), 1.0)`, each segment unescaped); an
/// error for groups nested deeper than [`MAX_NESTING`].
pub(crate) fn weighted_segments(text: &str) -> Result<Vec<(String, f64)>, String> {
    let escaped = text.replace("\\)", ESCAPED_CLOSE).replace("\\(", ESCAPED_OPEN);
    let mut out = Vec::new();
    token_weights(&escaped, 1.0, 0, &mut out)?;
    Ok(out
        .into_iter()
        .map(|(segment, weight)| (segment.replace(ESCAPED_CLOSE, ")").replace(ESCAPED_OPEN, "("), weight))
        .collect())
}

/// Top-level pieces of `text`: runs of plain text and whole parenthesised groups.
fn parse_parentheses(text: &str) -> Vec<String> {
    let mut result = Vec::new();
    let mut current = String::new();
    let mut nesting = 0i64;
    for c in text.chars() {
        match c {
            '(' => {
                if nesting == 0 {
                    if !current.is_empty() {
                        result.push(std::mem::take(&mut current));
                    }
                    current.push('(');
                } else {
                    current.push(c);
                }
                nesting += 1;
            }
            ')' => {
                nesting -= 1;
                if nesting == 0 {
                    current.push(')');
                    result.push(std::mem::take(&mut current));
                } else {
                    current.push(c);
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        result.push(current);
    }
    result
}

/// Appends the weighted segments of `text`, read at `weight` inside `depth` groups, to `out`.
fn token_weights(text: &str, weight: f64, depth: usize, out: &mut Vec<(String, f64)>) -> Result<(), String> {
    if depth > MAX_NESTING {
        return Err(format!("the prompt nests parentheses more than {MAX_NESTING} deep"));
    }
    for piece in parse_parentheses(text) {
        let grouped = piece.len() >= 2 && piece.starts_with('(') && piece.ends_with(')');
        if !grouped {
            out.push((piece, weight));
            continue;
        }
        let mut inner = &piece[1..piece.len() - 1];
        let mut inner_weight = weight * EMPHASIS;
        if let Some(colon) = inner.rfind(':').filter(|&i| i > 0) {
            if let Some(w) = python_float(&inner[colon + 1..]) {
                inner_weight = w;
                inner = &inner[..colon];
            }
        }
        token_weights(inner, inner_weight, depth + 1, out)?;
    }
    Ok(())
}

/// Python's `float(text)` for the spellings prompts use: surrounding whitespace allowed,
/// decimal and exponent forms, `inf` and `nan`. `None` where Python raises.
fn python_float(text: &str) -> Option<f64> {
    let t = text.trim();
    // Rust also reads "infinity"-style words as Python does; it refuses "1_0", which Python
    // reads as 10: digits separated by single underscores.
    if t.contains('_') {
        let parts: Vec<&str> = t.split('_').collect();
        let digits_around = parts.windows(2).all(|w| {
            w[0].chars().last().is_some_and(|c| c.is_ascii_digit())
                && w[1].chars().next().is_some_and(|c| c.is_ascii_digit())
        });
        return if digits_around {
            t.replace('_', "").parse().ok()
        } else {
            None
        };
    }
    t.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Vec<(String, f64)> {
        weighted_segments(text).unwrap()
    }

    fn seg(s: &str, w: f64) -> (String, f64) {
        (s.to_string(), w)
    }

    /// Expected values worked out from ComfyUI's `token_weights` (Python float arithmetic).
    #[test]
    fn comfyui_weighting() {
        assert_eq!(parsed("a cat"), vec![seg("a cat", 1.0)]);
        assert_eq!(parsed(""), Vec::<(String, f64)>::new());
        assert_eq!(
            parsed("a (cat:1.2) sat"),
            vec![seg("a ", 1.0), seg("cat", 1.2), seg(" sat", 1.0)]
        );
        assert_eq!(parsed("((cat))"), vec![seg("cat", 1.1 * 1.1)]);
        assert_eq!(parsed("((cat))")[0].1, 1.2100000000000002);
        assert_eq!(parsed("(cat)"), vec![seg("cat", 1.1)]);
        // Square brackets are text: no de-weighting.
        assert_eq!(parsed("[cat] dog"), vec![seg("[cat] dog", 1.0)]);
        // An explicit weight replaces the outer one; nesting inside it multiplies.
        assert_eq!(
            parsed("(a (b:0.5) c:1.5)"),
            vec![seg("a ", 1.5), seg("b", 0.5), seg(" c", 1.5)]
        );
        assert_eq!(parsed("((a):2)"), vec![seg("a", 2.0 * 1.1)]);
        // Escaped parentheses stay literal.
        assert_eq!(parsed(r"a \(cat\) b"), vec![seg("a (cat) b", 1.0)]);
        assert_eq!(parsed(r"(\(x\):1.3)"), vec![seg("(x)", 1.3)]);
        // Only the last colon counts, and only when a number follows it.
        assert_eq!(parsed("(a:b:0.8)"), vec![seg("a:b", 0.8)]);
        assert_eq!(parsed("(time: noon)"), vec![seg("time: noon", 1.1)]);
        assert_eq!(parsed("(:1.5)"), vec![seg(":1.5", 1.1)]);
        assert_eq!(parsed("(x: 1.5 )"), vec![seg("x", 1.5)]);
        assert_eq!(parsed("(x:1e1)"), vec![seg("x", 10.0)]);
        assert_eq!(parsed("(x:1_5)"), vec![seg("x", 15.0)]);
        assert_eq!(parsed("(x:_15)"), vec![seg("x:_15", 1.1)]);
        assert_eq!(parsed("(x:-1)"), vec![seg("x", -1.0)]);
        // Empty groups give nothing; unbalanced parentheses read as ComfyUI reads them.
        assert_eq!(parsed("a () b"), vec![seg("a ", 1.0), seg(" b", 1.0)]);
        assert_eq!(parsed("(cat"), vec![seg("(cat", 1.0)]);
        assert_eq!(parsed("cat)"), vec![seg("cat)", 1.0)]);
        assert_eq!(parsed("a) (b"), vec![seg("a) (b", 1.0)]);
        assert_eq!(parsed("((a) b"), vec![seg("((a) b", 1.0)]);
        assert_eq!(parsed("a (b))"), vec![seg("a ", 1.0), seg("b", 1.1), seg(")", 1.0)]);
    }

    #[test]
    fn malformed_input_never_panics() {
        for text in [
            "(((((",
            ")))))",
            "(:)",
            "(é:1.2)",
            "(日本:0.5)",
            "\\",
            "\\(",
            "(\\)",
            ":::",
            "(\u{0}\u{1})",
        ] {
            let _ = parsed(text);
        }
        let deep = |n: usize| "(".repeat(n) + "x" + &")".repeat(n);
        let out = parsed(&deep(MAX_NESTING));
        assert_eq!(out.len(), 1);
        assert!(out[0].1 > 1e10);
        assert!(weighted_segments(&deep(MAX_NESTING + 1)).is_err());
        assert!(weighted_segments(&deep(100_000)).is_err());
        // Unclosed, they are text.
        assert_eq!(parsed(&"(".repeat(100_000)).len(), 1);
    }
}
