//! The 200 body: one JSON event per line, produced as the analysis and the renders go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;
use weft_v2m::{self as v2m, Renderer, TempVideo, VideoInfo};

use super::{DetailError, V2mService};

/// `event` as one NDJSON line.
fn line(event: &Json) -> Bytes {
    let mut text = event.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// An `error` event line.
fn error_event(code: &str, message: &str) -> Bytes {
    line(&json!({ "type": "error", "code": code, "message": message }))
}

/// Produces the event stream; returns early (dropping the video guard, killing ffmpeg)
/// as soon as the client has gone.
pub(super) async fn produce(
    svc: Arc<V2mService>,
    video: TempVideo,
    info: VideoInfo,
    prompt: Option<String>,
    copies: u32,
    seed: u64,
    tx: mpsc::Sender<Bytes>,
) {
    let duration = json!({ "type": "duration", "duration_sec": info.duration_s });
    if tx.send(line(&duration)).await.is_err() {
        return;
    }
    let analysis = tokio::select! {
        analysis = svc.engine.analyze_probed(video.path(), info) => analysis,
        _ = tx.closed() => return,
    };
    drop(video);
    let analysis = match analysis {
        Ok(a) => a,
        Err(e) => {
            let e = DetailError::from(e);
            let _ = tx.send(error_event(e.code(), &e.message())).await;
            return;
        }
    };
    let prompts: Vec<&str> = prompt.as_deref().into_iter().collect();
    let plans = v2m::plan(&analysis, &prompts, copies, seed);
    let titles: Vec<&str> = plans.iter().map(|p| p.title.as_str()).collect();
    if tx
        .send(line(&json!({ "type": "titles", "titles": titles })))
        .await
        .is_err()
    {
        return;
    }
    for p in &plans {
        let title = json!({
            "type": "title",
            "copy_index": p.copy_index,
            "prompt_index": p.prompt_index,
            "stream_index": p.stream_index,
            "title": p.title,
            "display_tags": p.display_tags,
            "summary": p.summary,
        });
        if tx.send(line(&title)).await.is_err() {
            return;
        }
    }
    // Making the renderers sets up a synthesizer each, and the first one loads the
    // SoundFont (a blocking read of several MB): off the async workers.
    let engine = svc.engine.clone();
    let made = tokio::task::spawn_blocking(move || {
        plans
            .iter()
            .map(|p| Ok((p.stream_index, engine.render(p)?)))
            .collect::<Result<Vec<_>, v2m::V2mError>>()
    })
    .await
    .unwrap_or_else(|e| Err(v2m::V2mError::GenerationFailed(e.to_string())));
    let renderers = match made {
        Ok(renderers) => renderers,
        Err(e) => {
            let e = DetailError::from(e);
            let _ = tx.send(error_event(e.code(), &e.message())).await;
            return;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut renders = Vec::new();
    for (index, renderer) in renderers {
        let (tx, stop, renders_limit) = (tx.clone(), stop.clone(), svc.renders.clone());
        renders.push(tokio::spawn(async move {
            let permit = tokio::select! {
                permit = renders_limit.acquire_owned() => permit.ok(),
                _ = tx.closed() => None,
            };
            let Some(permit) = permit else { return Ok(false) };
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                render_stream(renderer, index, &tx, &stop)
            })
            .await
        }));
    }
    let mut failed = false;
    for render in renders {
        match render.await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return, // the client went away
            Ok(Err(e)) | Err(e) => {
                tracing::error!(error = %e, "a video-to-music render failed");
                failed = true;
                stop.store(true, Ordering::SeqCst);
            }
        }
    }
    let last = if failed {
        error_event("generation_failed", "rendering a stream failed")
    } else {
        line(&json!({ "type": "complete" }))
    };
    let _ = tx.send(last).await;
}

/// Sends one stream's chunks; `false` when it stopped early (client gone, or told to).
fn render_stream(renderer: Renderer, index: u32, tx: &mpsc::Sender<Bytes>, stop: &AtomicBool) -> bool {
    for chunk in renderer {
        if tx.is_closed() || stop.load(Ordering::SeqCst) {
            return false;
        }
        let data = base64::engine::general_purpose::STANDARD.encode(&chunk);
        let text = format!("{{\"type\":\"audio_chunk\",\"stream_index\":{index},\"data\":\"{data}\"}}\n");
        if tx.blocking_send(Bytes::from(text)).is_err() {
            return false;
        }
    }
    true
}
