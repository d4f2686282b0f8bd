//! JSON request bodies, bounded. A JSON value in memory is many times its text (a `0,` of
//! two bytes becomes a 32-byte value in a growing array), so a body is charged to the
//! server's parse budget twice: its declared length before it is read, then, before it is
//! parsed, an estimate of what the parse makes. A body that can never fit gets 413; one that
//! does not fit now gets 429 `server_busy` with `Retry-After`. Before that estimate, a scan of
//! the text refuses (422) an object with too many keys, too many keys in all, or too many
//! values in all.
//!
//! Public face: [`ParseBudget`], [`BudgetedBody`] and [`budgeted_body`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value as Json;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::{ApiError, AppState};

/// Most keys one JSON object of a request may have.
pub const MAX_KEYS_PER_OBJECT: u64 = 20_000;
/// Most keys a request's JSON may have in all its objects.
pub const MAX_TOTAL_KEYS: u64 = 250_000;
/// Most values (scalars, arrays and objects, keys not counted) a request's JSON may hold.
pub const MAX_TOTAL_VALUES: u64 = 1_000_000;
/// What the parse makes of one value or one key beyond its text: a `serde_json::Value` (32
/// bytes) and the slack of the vector or map that holds it.
const BYTES_PER_TOKEN: u64 = 48;
/// Containers deeper than this are left to the parser, which refuses them (its own limit is
/// 128).
const MAX_SCANNED_DEPTH: usize = 129;
/// Request bodies from this size on are parsed on a blocking thread: a workflow of tens of
/// MiB takes milliseconds to parse, which would hold one of tokio's few async workers (two
/// on a 2-core machine) and every request and job step queued behind it.
const PARSE_ON_BLOCKING_THREAD: usize = 256 << 10;
/// What a caller refused for a busy budget is told to wait, in seconds.
const BUSY_RETRY_AFTER: u64 = 1;

/// The server's budget of bytes that request bodies and their parses may hold at once.
#[derive(Debug)]
pub struct ParseBudget {
    limit: u64,
    used: AtomicU64,
}

impl ParseBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Reserves `bytes` more, or refuses: 413 when they could never fit, 429 when they do not
    /// fit now.
    fn reserve(&self, bytes: u64, what: &str) -> Result<(), ApiError> {
        if bytes > self.limit {
            return Err(ApiError::PayloadTooLarge(format!(
                "{what} needs {} MiB, more than this server's parse budget of {} MiB",
                bytes.div_ceil(1 << 20),
                self.limit >> 20
            )));
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| ApiError::ServerBusy {
                retry_after: BUSY_RETRY_AFTER,
            })
    }
}

/// Bytes held in the parse budget, given back when dropped.
#[derive(Debug)]
pub struct BudgetCharge {
    budget: Arc<ParseBudget>,
    bytes: u64,
}

impl BudgetCharge {
    fn take(budget: &Arc<ParseBudget>, bytes: u64, what: &str) -> Result<Self, ApiError> {
        budget.reserve(bytes, what)?;
        Ok(Self {
            budget: budget.clone(),
            bytes,
        })
    }

    /// Grows the charge to `bytes` in all (no change when it holds that much already).
    fn grow_to(&mut self, bytes: u64, what: &str) -> Result<(), ApiError> {
        if bytes <= self.bytes {
            return Ok(());
        }
        if bytes > self.budget.limit {
            return self.budget.reserve(bytes, what);
        }
        self.budget.reserve(bytes - self.bytes, what)?;
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for BudgetCharge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A request body read within the parse budget; the budget holds it until it is dropped.
#[derive(Debug)]
pub struct BudgetedBody {
    /// The body's bytes.
    pub bytes: bytes::Bytes,
    charge: BudgetCharge,
}

impl BudgetedBody {
    /// The body parsed as JSON, with the charge that now covers the parsed value: keep it as
    /// long as the value. 422 for too many keys or values, 413/429 for the budget, and a 400
    /// `invalid_json` for text that is not JSON.
    pub async fn parse(self) -> Result<(Json, BudgetCharge), ApiError> {
        let Self { bytes, mut charge } = self;
        let shape = Shape::scan(&bytes);
        shape.check()?;
        charge.grow_to(shape.parse_bytes(bytes.len()), "parsing this body")?;
        let parsed = if bytes.len() < PARSE_ON_BLOCKING_THREAD {
            serde_json::from_slice(&bytes)
        } else {
            tokio::task::spawn_blocking(move || serde_json::from_slice(&bytes))
                .await
                .unwrap_or_else(|e| Err(serde::de::Error::custom(format!("the body's parse was lost: {e}"))))
        };
        let value = parsed.map_err(|e| ApiError::InvalidJson(format!("the body is not valid JSON: {e}")))?;
        Ok((value, charge))
    }
}

/// A body of at most the server's JSON size, read within its parse budget: the declared
/// length is reserved before a byte is read, so slow or many senders cannot make the server
/// buffer more than the budget.
pub fn budgeted_body(state: &Arc<AppState>) -> BoxedFilter<(BudgetedBody,)> {
    let budget = state.json_budget.clone();
    warp::body::content_length_limit(state.config.max_json_bytes)
        .and(warp::header::optional::<u64>("content-length"))
        .and_then(move |length: Option<u64>| {
            let budget = budget.clone();
            async move { BudgetCharge::take(&budget, length.unwrap_or(0), "this body").map_err(warp::reject::custom) }
        })
        .and(warp::body::bytes())
        .map(|charge, bytes| BudgetedBody { bytes, charge })
        .boxed()
}

/// The most bytes of a body that a route reads only to drop it (see [`ignored_body`]).
const IGNORED_BODY_BYTES: usize = 64 << 10;

/// Reads and drops a body that the route does not use (a cancel's `{}`), refusing one over
/// [`IGNORED_BODY_BYTES`]. Left unread, it would cost the client its keep-alive connection:
/// a body that arrives after the reply leaves the server no way to find the next request.
pub fn ignored_body() -> BoxedFilter<()> {
    warp::body::stream().and_then(drain).untuple_one().boxed()
}

/// Reads `body` to its end, at most [`IGNORED_BODY_BYTES`] of it.
async fn drain<B: bytes::Buf>(
    body: impl futures::Stream<Item = Result<B, warp::Error>>,
) -> Result<(), warp::Rejection> {
    use futures::TryStreamExt;
    let mut body = std::pin::pin!(body);
    let mut read = 0;
    while let Some(chunk) = body
        .try_next()
        .await
        .map_err(|e| warp::reject::custom(ApiError::InvalidRequest(format!("the body could not be read: {e}"))))?
    {
        read += chunk.remaining();
        if read > IGNORED_BODY_BYTES {
            return Err(warp::reject::custom(ApiError::PayloadTooLarge(format!(
                "this request takes no body; at most {} KiB of one is read",
                IGNORED_BODY_BYTES >> 10
            ))));
        }
    }
    Ok(())
}

/// What a scan of JSON text counts, without building anything.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Keys in all objects.
    pub(crate) keys: u64,
    /// Keys of the largest object.
    pub(crate) widest_object: u64,
    /// Scalars, arrays and objects.
    pub(crate) values: u64,
}

impl Shape {
    /// Counts `text`'s keys and values. Text that is not JSON is counted as far as it goes;
    /// the parse that follows refuses it.
    pub(crate) fn scan(text: &[u8]) -> Shape {
        let mut shape = Shape::default();
        // Per open container: the keys of an object so far, or None for an array.
        let mut open: Vec<Option<u64>> = Vec::new();
        let mut in_string = false;
        let mut escaped = false;
        let mut in_scalar = false;
        for &byte in text {
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            let starts_value = !matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b']' | b'}');
            if starts_value && !in_scalar {
                shape.values += 1;
            }
            in_scalar = starts_value && !matches!(byte, b'"' | b'[' | b'{');
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' if open.len() >= MAX_SCANNED_DEPTH => return shape,
                b'{' => open.push(Some(0)),
                b'[' => open.push(None),
                b'}' | b']' => {
                    open.pop();
                }
                b':' => {
                    // A key was counted as a value when its string began.
                    shape.values = shape.values.saturating_sub(1);
                    shape.keys += 1;
                    if let Some(Some(keys)) = open.last_mut() {
                        *keys += 1;
                        shape.widest_object = shape.widest_object.max(*keys);
                    }
                }
                _ => {}
            }
        }
        shape
    }

    /// What `value` holds, counted from the value itself (the fuzz target checks that a
    /// scan counts at least this).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn of(value: &Json) -> Shape {
        let mut shape = Shape {
            values: 1,
            ..Shape::default()
        };
        match value {
            Json::Array(items) => items.iter().for_each(|v| shape.add(Shape::of(v))),
            Json::Object(map) => {
                shape.keys = map.len() as u64;
                shape.widest_object = map.len() as u64;
                map.values().for_each(|v| shape.add(Shape::of(v)));
            }
            _ => {}
        }
        shape
    }

    #[cfg(feature = "fuzzing")]
    fn add(&mut self, inner: Shape) {
        self.keys += inner.keys;
        self.values += inner.values;
        self.widest_object = self.widest_object.max(inner.widest_object);
    }

    /// 422 when over a bound.
    fn check(&self) -> Result<(), ApiError> {
        if self.widest_object > MAX_KEYS_PER_OBJECT {
            return Err(ApiError::TooManyKeys(format!(
                "an object of the body has {} keys; at most {MAX_KEYS_PER_OBJECT} are accepted",
                self.widest_object
            )));
        }
        if self.keys > MAX_TOTAL_KEYS {
            return Err(ApiError::TooManyKeys(format!(
                "the body has {} keys in all; at most {MAX_TOTAL_KEYS} are accepted",
                self.keys
            )));
        }
        if self.values > MAX_TOTAL_VALUES {
            return Err(ApiError::TooManyValues(format!(
                "the body has {} values; at most {MAX_TOTAL_VALUES} are accepted",
                self.values
            )));
        }
        Ok(())
    }

    /// What parsing a body of `len` bytes with this shape holds at most: its text (strings
    /// are copied) and each value and key.
    fn parse_bytes(&self, len: usize) -> u64 {
        len as u64 + (self.values + self.keys) * BYTES_PER_TOKEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(text: &str) -> Shape {
        Shape::scan(text.as_bytes())
    }

    #[test]
    fn a_scan_counts_keys_values_and_the_widest_object() {
        assert_eq!(
            shape(r#"{"a": 1, "b": [true, null, "x"], "c": {"d": -2.5e3}}"#),
            Shape {
                keys: 4,
                widest_object: 3,
                values: 8
            }
        );
        assert_eq!(
            shape("[]"),
            Shape {
                keys: 0,
                widest_object: 0,
                values: 1
            }
        );
    }

    #[test]
    fn a_scan_ignores_structure_inside_strings() {
        let s = shape(r#"{"k:{[,": "v\" : {\"x\": 1}"}"#);
        assert_eq!((s.keys, s.widest_object, s.values), (1, 1, 2));
    }

    #[test]
    fn a_scan_stops_at_the_parsers_depth() {
        let deep = "[".repeat(10_000);
        assert_eq!(shape(&deep).values, MAX_SCANNED_DEPTH as u64 + 1);
    }

    #[test]
    fn the_parse_budget_refuses_what_never_fits_and_what_does_not_fit_now() {
        let budget = ParseBudget::new(100);
        assert!(matches!(
            BudgetCharge::take(&budget, 101, "x"),
            Err(ApiError::PayloadTooLarge(_))
        ));
        let mut held = BudgetCharge::take(&budget, 60, "x").unwrap();
        assert!(matches!(
            BudgetCharge::take(&budget, 50, "x"),
            Err(ApiError::ServerBusy { .. })
        ));
        held.grow_to(100, "x").unwrap();
        drop(held);
        assert!(BudgetCharge::take(&budget, 100, "x").is_ok());
    }
}
