//! The blocking waits of `wasi:io/poll` (`poll` and `pollable.block`, which every guest
//! sleep, clock wait and blocking read ends in), raced against the call's deadline and its
//! job's cancel. wasmtime-wasi's own versions wait for the pollables alone, so a guest
//! sleeping in WASI was out of reach of the epoch interrupt, which only stops wasm code.

use std::future::Future;

use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi_io::bindings::wasi::io::poll::{Host as _, HostPollable as _};

use crate::runtime::call::Deadline;
use crate::runtime::capabilities::CallState;

/// The `wasi:io/poll` interface, at the version wasmtime-wasi links; guests importing an
/// older 0.2 version reach it too.
const POLL: &str = "wasi:io/poll@0.2.12";

/// Replaces `poll` and `[method]pollable.block` of [`POLL`] with versions that end the call
/// at its deadline or cancel. Call it after the rest of WASI is linked.
pub(super) fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut poll = linker.instance(POLL)?;
    poll.func_wrap(
        "poll",
        |mut store: StoreContextMut<'_, CallState>, (pollables,): (Vec<Resource<DynPollable>>,)| {
            let state = store.data_mut();
            let deadline = state.deadline.clone();
            let ready = wait(&deadline, state.table.poll(pollables))?;
            Ok((ready,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: StoreContextMut<'_, CallState>, (pollable,): (Resource<DynPollable>,)| {
            let state = store.data_mut();
            let deadline = state.deadline.clone();
            wait(&deadline, state.table.block(pollable))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
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
