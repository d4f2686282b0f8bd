//! The blocking waits of WASI, raced against the call's deadline and its job's cancel:
//! `wasi:io/poll`'s `poll` and `pollable.block` (which every guest sleep and clock wait ends
//! in) and the `blocking-*` methods of `wasi:io/streams` (sockets a plugin was granted).
//! wasmtime-wasi's own versions wait for the I/O alone, so a guest blocked in WASI was out
//! of reach of the epoch interrupt, which only stops wasm code.

use std::future::Future;

use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, DynPollable, StreamResult};
use wasmtime_wasi_io::bindings::wasi::io::poll::{Host as _, HostPollable as _};
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    Host as _, HostInputStream as Input, HostOutputStream as Output, StreamError,
};

use super::Wasi;
use crate::runtime::call::Deadline;
use crate::runtime::capabilities::{own, CallState};

/// The `wasi:io/poll` interface, at the version wasmtime-wasi links; guests importing an
/// older 0.2 version reach it too.
const POLL: &str = "wasi:io/poll@0.2.12";
/// The `wasi:io/streams` interface, at the same version.
const STREAMS: &str = "wasi:io/streams@0.2.12";

/// A stream operation's result as the guest sees it: its value, or a WIT `stream-error`.
type Streamed<T> = wasmtime::Result<(Result<T, StreamError>,)>;

/// Replaces the blocking functions of [`POLL`] and [`STREAMS`] with versions that end the
/// call at its deadline or cancel. Call it after the rest of WASI is linked.
pub(super) fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut poll = linker.instance(POLL)?;
    poll.func_wrap(
        "poll",
        |mut store: StoreContextMut<'_, CallState>, (pollables,): (Vec<Resource<DynPollable>>,)| {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let ready = wait(&deadline, state.table.poll(pollables))?;
            Ok((ready,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: StoreContextMut<'_, CallState>, (pollable,): (Resource<DynPollable>,)| {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            wait(&deadline, state.table.block(pollable))
        },
    )?;
    let mut streams = linker.instance(STREAMS)?;
    streams.func_wrap(
        "[method]input-stream.blocking-read",
        |mut store: StoreContextMut<'_, CallState>,
         (stream, len): (Resource<DynInputStream>, u64)|
         -> Streamed<Vec<u8>> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let read = wait(&deadline, async {
                Ok(Input::blocking_read(&mut state.table, stream, len).await)
            })?;
            to_guest(&mut state.table, read)
        },
    )?;
    streams.func_wrap(
        "[method]input-stream.blocking-skip",
        |mut store: StoreContextMut<'_, CallState>, (stream, len): (Resource<DynInputStream>, u64)| -> Streamed<u64> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let skipped = wait(&deadline, async {
                Ok(Input::blocking_skip(&mut state.table, stream, len).await)
            })?;
            to_guest(&mut state.table, skipped)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-and-flush",
        |mut store: StoreContextMut<'_, CallState>,
         (stream, bytes): (Resource<DynOutputStream>, Vec<u8>)|
         -> Streamed<()> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let written = wait(&deadline, async {
                Ok(Output::blocking_write_and_flush(&mut state.table, stream, bytes).await)
            })?;
            to_guest(&mut state.table, written)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-zeroes-and-flush",
        |mut store: StoreContextMut<'_, CallState>, (stream, len): (Resource<DynOutputStream>, u64)| -> Streamed<()> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let written = wait(&deadline, async {
                Ok(Output::blocking_write_zeroes_and_flush(&mut state.table, stream, len).await)
            })?;
            to_guest(&mut state.table, written)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-flush",
        |mut store: StoreContextMut<'_, CallState>, (stream,): (Resource<DynOutputStream>,)| -> Streamed<()> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let flushed = wait(&deadline, async {
                Ok(Output::blocking_flush(&mut state.table, stream).await)
            })?;
            to_guest(&mut state.table, flushed)
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-splice",
        |mut store: StoreContextMut<'_, CallState>,
         (stream, source, len): (Resource<DynOutputStream>, Resource<DynInputStream>, u64)|
         -> Streamed<u64> {
            let state = own::<Wasi>(store.data_mut()).core;
            let deadline = state.deadline.clone();
            let spliced = wait(&deadline, async {
                Ok(Output::blocking_splice(&mut state.table, stream, source, len).await)
            })?;
            to_guest(&mut state.table, spliced)
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `result` for the guest: a failed stream operation becomes its WIT `stream-error` (an
/// error resource in `table`, or `closed`); a trap stays a trap.
fn to_guest<T>(table: &mut ResourceTable, result: StreamResult<T>) -> Streamed<T> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(error) => Ok((Err(table.convert_stream_error(error)?),)),
    }
}

/// Runs `work` to its end, or until `deadline` is reached, which traps the call with the
/// reason (`node_timeout` or `canceled`).
fn wait<T>(deadline: &Deadline, work: impl Future<Output = wasmtime::Result<T>>) -> wasmtime::Result<T> {
    wasmtime_wasi::runtime::in_tokio(async {
        tokio::select! {
            done = work => done,
            why = deadline.reached() => Err(why.into()),
        }
    })
}
