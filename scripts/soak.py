#!/usr/bin/env python3
"""Soak run: N minutes of mixed load on a real `weft serve --auth keys` from several tenants.

Each tenant runs a few closed-loop clients that pick, at random, from: small image and text
jobs, the hostile test plugins (spinning, memory bombs, panics, stack overflows, huge and loud
outputs, stdout floods, sandbox escapes), jobs canceled while running, bursts that hit the
tenant's queue share, uploads, uploads aborted half-way (the connection dropped), and job
reads and lists. Every accepted job (201) is remembered.

Every --interval seconds it samples the server's RSS, open file descriptors and threads
(from /proc) and the p50/p99 latency of the HTTP requests made in that interval, and prints
a row. At the end it stops the load, waits for every accepted job to end, and checks that
none was lost (each is readable and terminal) and that every plain job succeeded.

Not a CI test: it needs minutes and competes for the CPU with anything else running.

    ./scripts/soak.py                 # 30 minutes, 4 tenants, debug build
    ./scripts/soak.py --minutes 10 --tenants 6 --binary target/release/weft
"""

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WASM = os.path.join(ROOT, "target/wasm/wasm32-wasip2/release")
HOSTILE = [
    "weft_test_loop", "weft_test_memory", "weft_test_panic", "weft_test_recursion",
    "weft_test_huge_output", "weft_test_loud", "weft_test_stdout_flood", "weft_test_escape",
    "weft_test_counter",
]
TERMINAL = {"succeeded", "failed", "canceled", "expired"}


def node(class_type, **inputs):
    return {"class_type": class_type, "inputs": inputs}


def preview(class_type, **inputs):
    return {"1": node(class_type, **inputs), "2": node("PreviewAny", source=["1", 0])}


def image_job(rng):
    side = rng.choice([32, 64, 128])
    return {
        "1": node("EmptyImage", width=side, height=side, batch_size=rng.randint(1, 3), color=rng.randint(0, 0xFFFFFF)),
        "2": node("ImageInvert", image=["1", 0]),
        "3": node("SaveImage", images=["2", 0], filename_prefix="soak"),
    }


def text_job(rng):
    return {
        "1": node("PrimitiveString", value="soak %d" % rng.randint(0, 10**9)),
        "2": node("StringConcatenate", string_a=["1", 0], string_b="!", delimiter=""),
        "3": node("SaveText", text=["2", 0], filename_prefix="soak"),
    }


# Hostile workflows: each must end `failed` (or, for the flood, `succeeded`), never hurt the
# server. The sizes are the test plugins' knobs, kept small enough for a shared machine.
HOSTILE_JOBS = [
    ("loop", lambda rng: preview("HostileLoop")),
    ("memory_bomb", lambda rng: preview("HostileMemoryBomb", chunk_mib=16, graceful=rng.random() < 0.5)),
    ("panic", lambda rng: preview("HostilePanic")),
    ("recursion", lambda rng: preview("HostileRecursion")),
    ("huge_output", lambda rng: preview("HostileHugeOutput", mib=8)),
    ("huge_file", lambda rng: {"1": node("HostileHugeFile", mib=4, filename_prefix="soak")}),
    ("loud_progress", lambda rng: {"1": node("HostileLoudProgress", mib=4)}),
    ("loud_error", lambda rng: preview("HostileLoudError", mib=4)),
    ("stdout_flood", lambda rng: preview("HostileStdoutFlood", megabytes=4)),
    ("escape", lambda rng: preview("HostileEscape", address="127.0.0.1:9")),
    ("file_name", lambda rng: {"1": node("HostileFileName", content="<script>x</script>",
                                                     extension="png/../../../etc/x", content_type="text/html")}),
]


class Stats:
    """Request latencies and counters, read and reset once per interval."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies = []
        self.counts = {}
        self.jobs = {}  # id -> (tenant key, kind)

    def request(self, seconds):
        with self.lock:
            self.latencies.append(seconds)

    def count(self, what, n=1):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def accepted(self, job_id, key, kind):
        with self.lock:
            self.jobs[job_id] = (key, kind)

    def take(self):
        with self.lock:
            latencies, self.latencies = self.latencies, []
            counts, self.counts = self.counts, {}
        return latencies, counts


class Client:
    def __init__(self, host, port, key, stats):
        self.host, self.port, self.key, self.stats = host, port, key, stats

    def call(self, method, path, body=None, headers=None):
        """(status, parsed JSON or None); a connection error is status 0."""
        h = {"authorization": "Bearer " + self.key}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["content-type"] = "application/json"
        h.update(headers or {})
        start = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            raw = r.read()
            status = r.status
        except OSError:
            self.stats.count("connection_errors")
            return 0, None
        finally:
            conn.close()
            self.stats.request(time.monotonic() - start)
        if status >= 500:
            self.stats.count("http_5xx")
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def submit(self, workflow, kind):
        status, body = self.call("POST", "/api/v2/jobs", {"workflow": workflow})
        if status == 201:
            self.stats.accepted(body["id"], self.key, kind)
            self.stats.count("accepted")
            return body["id"]
        self.stats.count("refused_%d" % status)
        return None

    def wait(self, job_id, deadline):
        while time.monotonic() < deadline:
            status, body = self.call("GET", "/api/v2/jobs/" + job_id)
            if status == 200 and body.get("status") in TERMINAL:
                return body
            time.sleep(0.2)
        return None

    def upload(self, size, rng):
        boundary = "soak%d" % rng.randint(0, 10**9)
        head = ('--%s\r\nContent-Disposition: form-data; name="file_path"\r\n\r\nsoak.bin\r\n'
                '--%s\r\nContent-Disposition: form-data; name="file"; filename="soak.bin"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n" % (boundary, boundary)).encode()
        tail = ("\r\n--%s--\r\n" % boundary).encode()
        body = head + os.urandom(size) + tail
        status, _ = self.raw_post("/api/v2/assets", boundary, body)
        self.stats.count("uploads_%d" % status)

    def raw_post(self, path, boundary, body):
        start = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request("POST", path, body=body, headers={
                "authorization": "Bearer " + self.key,
                "content-type": "multipart/form-data; boundary=" + boundary,
            })
            r = conn.getresponse()
            r.read()
            return r.status, None
        except OSError:
            self.stats.count("connection_errors")
            return 0, None
        finally:
            conn.close()
            self.stats.request(time.monotonic() - start)

    def aborted_upload(self, rng):
        """Announces a 2 MB upload, sends part of it, and drops the connection."""
        boundary = "abort%d" % rng.randint(0, 10**9)
        head = ("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n" % boundary).encode()
        request = ("POST /api/v2/assets HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: multipart/form-data; boundary=%s\r\nContent-Length: %d\r\n\r\n"
                   % (self.host, self.port, self.key, boundary, 2_000_000)).encode()
        try:
            with socket.create_connection((self.host, self.port), timeout=10) as s:
                s.sendall(request + head + os.urandom(rng.randint(1, 200_000)))
                time.sleep(rng.random() * 0.2)
        except OSError:
            self.stats.count("connection_errors")
        self.stats.count("aborted_uploads")


def tenant_loop(client, rng, stop, stats):
    actions = [
        (30, "image"), (20, "text"), (12, "hostile"), (4, "cancel"), (2, "burst"),
        (6, "upload"), (6, "aborted_upload"), (8, "list"),
    ]
    total = sum(w for w, _ in actions)
    while not stop.is_set():
        pick = rng.uniform(0, total)
        for weight, action in actions:
            pick -= weight
            if pick <= 0:
                break
        deadline = time.monotonic() + 300
        if action == "image":
            job = client.submit(image_job(rng), "image")
            if job and (client.wait(job, deadline) or {}).get("status") != "succeeded":
                stats.count("plain_job_not_succeeded")
        elif action == "text":
            job = client.submit(text_job(rng), "text")
            if job and (client.wait(job, deadline) or {}).get("status") != "succeeded":
                stats.count("plain_job_not_succeeded")
        elif action == "hostile":
            kind, make = rng.choice(HOSTILE_JOBS)
            job = client.submit(make(rng), "hostile_" + kind)
            if job:
                client.wait(job, deadline)
        elif action == "cancel":
            job = client.submit(preview("PoliteCounter", seconds=30.0), "canceled")
            if job:
                time.sleep(rng.random())
                client.call("POST", "/api/v2/jobs/%s/cancel" % job)
                client.wait(job, deadline)
        elif action == "burst":
            jobs = [client.submit(preview("SlowCounter", seconds=0.2), "burst") for _ in range(24)]
            for job in filter(None, jobs):
                client.wait(job, deadline)
        elif action == "upload":
            client.upload(rng.randint(1, 256 * 1024), rng)
        elif action == "aborted_upload":
            client.aborted_upload(rng)
        else:
            client.call("GET", "/api/v2/jobs?limit=20")


def proc_sample(pid):
    fields = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    rss_mib = int(fields["VmRSS"].split()[0]) / 1024
    fds = len(os.listdir("/proc/%d/fd" % pid))
    return rss_mib, fds, int(fields["Threads"])


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--clients", type=int, default=2, help="closed-loop clients per tenant")
    ap.add_argument("--interval", type=float, default=60, help="seconds between samples")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/debug/weft"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    missing = [n for n in HOSTILE if not os.path.exists(os.path.join(WASM, n + ".wasm"))]
    if missing:
        subprocess.run([os.path.join(ROOT, "scripts/build-wasm.sh"), "test"], check=True, stdout=subprocess.DEVNULL)
    if not os.path.exists(args.binary):
        sys.exit("no weft binary at %s: run `cargo build -p weft --bin weft` first" % args.binary)

    work = tempfile.mkdtemp(prefix="weft-soak-")
    data_dir, plugins_dir = os.path.join(work, "data"), os.path.join(work, "plugins")
    os.makedirs(plugins_dir)
    for n in HOSTILE:
        shutil.copy(os.path.join(WASM, n + ".wasm"), plugins_dir)
    keys = []
    for t in range(args.tenants):
        out = subprocess.run([args.binary, "keys", "create", "--tenant", "soak%d" % t, "--data-dir", data_dir],
                             check=True, capture_output=True, text=True).stdout
        keys.append(out.strip().splitlines()[-1].strip())

    server = subprocess.Popen(
        [args.binary, "serve", "--addr", "127.0.0.1:0", "--data-dir", data_dir, "--plugins-dir", plugins_dir,
         "--auth", "keys", "--workers", str(args.workers), "--node-timeout-ms", "3000",
         "--node-memory-mib", "128", "--job-memory-mib", "256", "--hostcall-mib", "16",
         "--tenant-queue-depth", "16", "--max-upload-bytes", "1000000", "--cache-mib", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, WEFT_LOG="error"))
    base = None
    for line in server.stdout:
        if line.startswith("weft listening on "):
            base = line[len("weft listening on "):].strip()
            break
    if base is None:
        sys.exit("weft exited before listening")
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    url = urllib.parse.urlparse(base)
    host, port = url.hostname, url.port

    stats = Stats()
    stop = threading.Event()
    threads = []
    for t, key in enumerate(keys):
        for c in range(args.clients):
            rng = random.Random(args.seed * 1000 + t * 10 + c)
            th = threading.Thread(target=tenant_loop, args=(Client(host, port, key, stats), rng, stop, stats),
                                  daemon=True)
            th.start()
            threads.append(th)

    print("soak: %s, %d tenants x %d clients, %.0f min, binary %s" % (base, args.tenants, args.clients,
                                                                     args.minutes, args.binary))
    header = "%6s %9s %5s %7s %8s %8s %8s %8s %9s %6s %5s" % (
        "min", "rss_mib", "fds", "threads", "requests", "p50_ms", "p99_ms", "accepted", "refused", "abort", "5xx")
    print(header)
    rows = []
    start = time.monotonic()
    end = start + args.minutes * 60
    next_sample = start + min(args.interval, args.minutes * 60)
    while True:
        time.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
        if server.poll() is not None:
            sys.exit("weft exited during the soak: %s" % server.returncode)
        latencies, counts = stats.take()
        rss, fds, nthreads = proc_sample(server.pid)
        refused = sum(v for k, v in counts.items() if k.startswith("refused_"))
        row = ((time.monotonic() - start) / 60, rss, fds, nthreads, len(latencies), percentile(latencies, 50) * 1000,
               percentile(latencies, 99) * 1000, counts.get("accepted", 0), refused,
               counts.get("aborted_uploads", 0), counts.get("http_5xx", 0))
        rows.append((row, counts))
        print("%6.1f %9.1f %5d %7d %8d %8.1f %8.1f %8d %9d %6d %5d" % row, flush=True)
        if time.monotonic() >= end:
            break
        next_sample += args.interval

    stop.set()
    for th in threads:
        th.join(timeout=330)
    # Every accepted job must still be readable by its tenant and end.
    lost, unfinished, outcomes = [], [], {}
    drain_deadline = time.monotonic() + 300
    for job_id, (key, kind) in list(stats.jobs.items()):
        client = Client(host, port, key, stats)
        body = client.wait(job_id, drain_deadline)
        if body is None:
            status, current = client.call("GET", "/api/v2/jobs/" + job_id)
            (lost if status == 404 else unfinished).append((job_id, kind, status))
            continue
        outcomes.setdefault(kind, {}).setdefault(body["status"], 0)
        outcomes[kind][body["status"]] += 1
    rss, fds, nthreads = proc_sample(server.pid)
    server.terminate()
    server.wait(timeout=60)
    shutil.rmtree(work, ignore_errors=True)

    totals = {}
    for _, counts in rows:
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
    print()
    print("after the load: rss %.1f MiB, %d fds, %d threads" % (rss, fds, nthreads))
    print("totals: " + ", ".join("%s=%d" % kv for kv in sorted(totals.items())))
    print("job outcomes by kind:")
    for kind in sorted(outcomes):
        print("  %-22s %s" % (kind, ", ".join("%s=%d" % kv for kv in sorted(outcomes[kind].items()))))
    print("accepted jobs: %d, lost: %d, unfinished: %d, plain jobs not succeeded: %d" % (
        len(stats.jobs), len(lost), len(unfinished), totals.get("plain_job_not_succeeded", 0)))
    failed = lost or unfinished or totals.get("plain_job_not_succeeded", 0) or totals.get("http_5xx", 0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
