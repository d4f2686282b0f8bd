#!/usr/bin/env python3
"""Scale-out figures for weft on PostgreSQL (docs/benchmarks.md, "Scale-out on PostgreSQL").

Starts its own throw-away PostgreSQL cluster (fsync and synchronous_commit on, the
defaults: every 201 is durable) and real `weft` processes sharing one database and one blob
dir, and prints:
  1. durable submits/s and their p50/p99, through 1 and through 3 API processes;
  2. jobs/s of the 3-node image graph (EmptyImage -> ImageInvert -> SaveImage) with 1, 2
     and 3 worker processes (a queue of jobs drained by the workers);
  3. the time from a status change committed on one process to its status event on
     another process's SSE stream;
  4. the time from a worker's kill -9 to its job being rescued (queued again) and running
     on another worker, with --lease-secs 2.

Usage: python3 scripts/bench-scaleout.py [--weft PATH] [--seconds N]
Uses target/release/weft if built, else target/debug/weft. Needs the test plugins
(./scripts/build-wasm.sh test) for the slow job of figure 4. Runs as root or not.
"""

import argparse
import glob
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_GRAPH = {
    "e": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["e", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bench"}},
}
TEXT_GRAPH = {"1": {"class_type": "SaveText", "inputs": {"text": "bench", "filename_prefix": "b"}}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A throw-away cluster, as the `postgres` user when run as root."""

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            sys.exit("PostgreSQL is not installed: run scripts/setup.sh")
        self.bin = bins[-1]
        self.root = tempfile.mkdtemp(prefix="weft-bench-pg-")
        self.port = free_port()
        os.makedirs(os.path.join(self.root, "sockets"))
        self.as_user = []
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", self.root], check=True)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.root, "data")
        subprocess.run(self.as_user + [f"{self.bin}/initdb", "-U", "postgres", "--auth=trust", "-D", data],
                       check=True, stdout=subprocess.DEVNULL)
        opts = f"-p {self.port} -k {self.root}/sockets -c listen_addresses=127.0.0.1 -c max_connections=300"
        subprocess.run(self.as_user + [f"{self.bin}/pg_ctl", "start", "-w", "-D", data, "-l",
                                       f"{self.root}/log", "-o", opts], check=True, stdout=subprocess.DEVNULL)
        self.data = data

    def sql(self, sql, db="postgres"):
        out = subprocess.run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-d", db, "-tAc", sql], check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def database(self, name):
        self.sql(f"CREATE DATABASE {name}")
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self):
        subprocess.run(self.as_user + [f"{self.bin}/pg_ctl", "stop", "-m", "fast", "-D", self.data],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.root, ignore_errors=True)


class Weft:
    def __init__(self, binary, database, blob_dir, role, workers=2, plugins=None, lease=2):
        self.data = tempfile.mkdtemp(prefix="weft-bench-")
        args = [binary, "serve", "--addr", "127.0.0.1:0", "--data-dir", self.data, "--database", database,
                "--blob-dir", blob_dir, "--role", role, "--workers", str(workers), "--queue-depth", "1000000",
                "--lease-secs", str(lease)]
        if plugins:
            args += ["--plugins-dir", plugins]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "WEFT_LOG": "error"})
        for line in self.proc.stdout:
            if line.startswith("weft listening on http://"):
                self.host, self.port = line.strip().rsplit("/", 1)[1].split(":")
                break
        else:
            sys.exit("weft exited before listening")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        sys.exit("weft did not become ready")

    def request(self, method, path, body=None, conn=None):
        c = conn or http.client.HTTPConnection(self.host, int(self.port), timeout=60)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, (json.loads(data) if data else None)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        shutil.rmtree(self.data, ignore_errors=True)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def durable_submits(binary, pg, blobs, apis, seconds, threads=8):
    db = pg.database(f"submits{apis}")
    procs = [Weft(binary, db, blobs, "api") for _ in range(apis)]
    latencies, stop = [], time.time() + seconds
    lock = threading.Lock()

    def client(i):
        target = procs[i % apis]
        conn = http.client.HTTPConnection(target.host, int(target.port), timeout=60)
        mine = []
        while time.time() < stop:
            t = time.perf_counter()
            status, _ = target.request("POST", "/api/v2/jobs", {"workflow": TEXT_GRAPH}, conn)
            if status != 201:
                raise SystemExit(f"submit failed: {status}")
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    started = time.time()
    [t.start() for t in ts]
    [t.join() for t in ts]
    elapsed = time.time() - started
    for p in procs:
        p.stop()
    print(f"durable submits through {apis} API process(es), {threads} clients: {len(latencies) / elapsed:.0f}/s, "
          f"p50 {pct(latencies, 50) * 1000:.1f} ms, p99 {pct(latencies, 99) * 1000:.1f} ms")


def drain(binary, pg, blobs, workers, jobs=3000):
    db = pg.database(f"drain{workers}")
    name = db.rsplit("/", 1)[1]
    api = Weft(binary, db, blobs, "api")
    conn = http.client.HTTPConnection(api.host, int(api.port), timeout=60)
    for _ in range(jobs):
        assert api.request("POST", "/api/v2/jobs", {"workflow": IMAGE_GRAPH}, conn)[0] == 201
    done = lambda: int(pg.sql("SELECT COUNT(*) FROM jobs WHERE status IN ('succeeded','failed')", name))
    # Processes start one after another (seconds each): the rate is taken over the window in
    # which all of them run, from the last one's readiness until the queue is drained.
    procs = [Weft(binary, db, blobs, "worker", workers=2) for _ in range(workers)]
    started, done_before = time.time(), done()
    while done() < jobs:
        time.sleep(0.05)
    elapsed = time.time() - started
    failed = pg.sql("SELECT COUNT(*) FROM jobs WHERE status = 'failed'", name)
    for p in procs + [api]:
        p.stop()
    measured = jobs - done_before
    if measured < jobs // 3:
        print(f"3-node image graph, {workers} worker process(es): too few jobs left to measure ({measured})")
        return
    print(f"3-node image graph, {workers} worker process(es) x 2 workers: {measured / elapsed:.0f} jobs/s "
          f"({measured} jobs measured, {failed} failed)")


def sse_latency(binary, pg, blobs, rounds=40):
    db = pg.database("sse")
    a = Weft(binary, db, blobs, "api")
    b = Weft(binary, db, blobs, "api")
    from_send, from_reply = [], []
    for _ in range(rounds):
        status, job = a.request("POST", "/api/v2/jobs", {"workflow": TEXT_GRAPH})
        jid = job["id"]
        conn = http.client.HTTPConnection(b.host, int(b.port), timeout=60)
        conn.request("GET", f"/api/v2/jobs/{jid}/events", headers={"accept": "text/event-stream"})
        stream = conn.getresponse()
        event = None
        while True:  # the snapshot
            line = stream.fp.readline().decode()
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            if line.strip() == "" and event:
                break
        sent = time.perf_counter()
        a.request("POST", f"/api/v2/jobs/{jid}/cancel", {})
        replied = time.perf_counter()
        while True:
            line = stream.fp.readline().decode()
            if line.startswith("data:") and '"canceled"' in line:
                got = time.perf_counter()
                break
        conn.close()
        from_send.append(got - sent)
        from_reply.append(max(0.0, got - replied))
    a.stop()
    b.stop()
    print(f"status change committed on A -> status event on B's stream ({rounds} rounds): "
          f"median {statistics.median(from_send) * 1000:.1f} ms, p99 {pct(from_send, 99) * 1000:.1f} ms from the "
          f"request; median {statistics.median(from_reply) * 1000:.1f} ms after A's reply")


def rescue(binary, pg, blobs, plugins):
    db = pg.database("rescue")
    name = db.rsplit("/", 1)[1]
    api = Weft(binary, db, blobs, "api", plugins=plugins)
    workers = [Weft(binary, db, blobs, "worker", workers=1, plugins=plugins) for _ in range(2)]
    slow = {"1": {"class_type": "SlowCounter", "inputs": {"seconds": 120.0}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}
    _, job = api.request("POST", "/api/v2/jobs", {"workflow": slow})
    jid = job["id"]
    while True:
        status, owner = pg.sql(f"SELECT status || ' ' || COALESCE(claimed_by, '-') FROM jobs WHERE id = '{jid}'",
                               name).split(" ")
        if status == "running":
            break
        time.sleep(0.02)
    doomed = next(w for w in workers if owner.startswith(f"{w.proc.pid}-"))
    killed = time.time()
    doomed.kill()
    requeued = None
    while True:
        status, owner = pg.sql(f"SELECT status || ' ' || COALESCE(claimed_by, '-') FROM jobs WHERE id = '{jid}'",
                               name).split(" ")
        mine = owner.startswith(f"{doomed.proc.pid}-")
        if requeued is None and (status == "queued" or not mine):
            requeued = time.time() - killed
        if status == "running" and not mine and owner != "-":
            running = time.time() - killed
            break
        time.sleep(0.02)
    for p in [api] + [w for w in workers if w is not doomed]:
        p.stop()
    shutil.rmtree(doomed.data, ignore_errors=True)
    print(f"kill -9 of the worker running a job -> rescued {requeued:.2f} s, running on another worker "
          f"{running:.2f} s (lease 2 s; rescue checks every 0.5 s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--only", choices=["submits", "drain", "sse", "rescue"])
    args = ap.parse_args()
    binary = args.weft or next((p for p in (f"{ROOT}/target/release/weft", f"{ROOT}/target/debug/weft")
                                if os.path.exists(p)), None)
    if not binary:
        sys.exit("build weft first (cargo build --release)")
    print(f"weft: {binary}; {os.cpu_count()} cores; figures are noisy on a shared machine")
    pg = Postgres()
    blobs = tempfile.mkdtemp(prefix="weft-bench-blobs-")
    run = lambda part: args.only in (None, part)
    try:
        if run("submits"):
            durable_submits(binary, pg, blobs, 1, args.seconds)
            durable_submits(binary, pg, blobs, 3, args.seconds)
        if run("drain"):
            for workers in (1, 2, 3):
                drain(binary, pg, blobs, workers)
        if run("sse"):
            sse_latency(binary, pg, blobs)
        plugins = f"{ROOT}/target/wasm/wasm32-wasip2/release"
        if not run("rescue"):
            pass
        elif os.path.exists(f"{plugins}/weft_test_counter.wasm"):
            only = tempfile.mkdtemp(prefix="weft-bench-plugins-")
            shutil.copy(f"{plugins}/weft_test_counter.wasm", only)
            rescue(binary, pg, blobs, only)
            shutil.rmtree(only, ignore_errors=True)
        else:
            print("kill -9 -> rescue: skipped (build the test plugins: ./scripts/build-wasm.sh test)")
    finally:
        pg.stop()
        shutil.rmtree(blobs, ignore_errors=True)


if __name__ == "__main__":
    main()
