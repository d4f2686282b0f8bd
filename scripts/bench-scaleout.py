#!/usr/bin/env python3
"""Scale-out figures for weft: PostgreSQL beside one SQLite process, against the scale-out goals.

Starts a throw-away PostgreSQL cluster (fsync and synchronous_commit on, the defaults: every
201 is durable; pg_stat_statements loaded) and real `weft serve` processes: on PostgreSQL
`--role api` and `--role worker` processes sharing one database, one blob dir and one
compiled-code cache; on SQLite one process (`--role all`). Every figure is taken on both
where it applies, in the same run. The figures (`--only NAME` runs one part):

  drain    Drain of trivial jobs: jobs/s of the 3-node image graph (EmptyImage -> ImageInvert
           -> SaveImage), the queue filled first and then drained, with 1, 2 and 4 worker
           processes (`--workers 4` each) and with one SQLite process (`--workers 4`). To fill
           the queue without draining it, every worker slot is first held by a long sleeping
           job; the jobs are submitted; the sleepers are canceled and the clock starts.
           Goal: >= 5,000 jobs/s, and at least the SQLite figure.
  mixed    Drain while submitting: client processes submit image jobs without pause to one
           API process while 1, 2 and 4 worker processes drain; submits/s and completed
           jobs/s over a fixed window (completions counted in the database). Also on SQLite.
  submits  Durable submits/s with p50/p99 latency through 1 and 3 API processes and through
           one SQLite process (whose worker slot is held, so that it only takes submits).
           Goal: >= 5,000/s, p99 < 20 ms.
  io       Scaling with I/O-bound jobs: HostileSleep(0.05 s) -> PreviewAny, a job that waits
           50 ms in WASI, with 1, 2 and 4 worker processes of `--workers 8` (and one SQLite
           process of `--workers 8`), the queue filled to 300 first (slots held, as for the
           drain) and kept there by the clients; the line says if it ran empty. Ratio
           to one process (goal >= 1.8x at 2, >= 3.5x at 4) and share of the ideal, 8 slots /
           0.05 s = 160 jobs/s a process (goal >= 80%).
  sse      Status event latency under load: a status change committed on process A (the
           cancel of a running job) to its event on process B's SSE stream, taken after A's
           reply (the commit precedes it) and from sending the request, while image jobs are
           submitted and drained in the background. On SQLite A and B are the same process.
           Goal: p99 < 5 ms.
  rescue   kill -9 of the worker process running a job, at default settings (no
           --lease-secs): time until the job is queued again and running on another worker.
           Goal: <= 2 s.
  cost     Database cost per job of the drain with 1 worker process: statements executed
           (pg_stat_statements), WAL bytes, PostgreSQL CPU (the postmaster and its children)
           and weft worker CPU; the top 10 statements by calls. The SQLite process's CPU per
           job beside it.

Lines starting with `!` flag what a server did unexpectedly (failed submits, worker slots that
did not run, a stalled drain); the error lines the weft processes logged are listed at the end.
It ends with a table: figure | SQLite 1 process | PostgreSQL | goal.

Usage: python3 scripts/bench-scaleout.py [--weft PATH] [--seconds N] [--jobs N] [--only PART]
Uses target/release/weft if built, else target/debug/weft (copied, so a rebuild during the
run does not change it). Needs PostgreSQL (scripts/setup.sh) and the test plugins
(./scripts/build-wasm.sh test). Runs as root or not. The load generator shares the
machine's cores with the servers and the database, so every figure includes its cost.
"""

import argparse
import ctypes
import glob
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WASM = f"{ROOT}/target/wasm/wasm32-wasip2/release"
PLUGINS = ("weft_test_host_hog.wasm", "weft_test_counter.wasm")
HEADERS = {"content-type": "application/json"}
TICK = os.sysconf("SC_CLK_TCK")
TAG = "/* bench-probe */"  # marks the script's own SQL, left out of the statement counts
SEP = "\x1f"
DONE = ("succeeded", "failed")

IMAGE_GRAPH = {
    "e": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["e", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bench"}},
}
TEXT_GRAPH = {"1": {"class_type": "SaveText", "inputs": {"text": "bench", "filename_prefix": "b"}}}


def sleep_graph(seconds, node="HostileSleep"):
    return {"1": {"class_type": node, "inputs": {"seconds": seconds}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}


IO_SECONDS, IO_SLOTS, IO_BACKLOG = 0.05, 8, 300
IO_GRAPH = sleep_graph(IO_SECONDS)
HOLD_GRAPH = sleep_graph(3600.0)  # holds a worker slot until canceled
PROBE_GRAPH = sleep_graph(5.0)  # a job the status event probe cancels while it runs
SLOW_GRAPH = sleep_graph(120.0, "SlowCounter")  # busy in wasm: the job the rescue moves
SSE_BACKLOG = 100
RESCUE_TIMEOUT = 45.0

FIGURES = [  # part, figure, goal
    ("drain", "drain, trivial jobs, queue filled first (jobs/s)", ">= 5,000 jobs/s and >= SQLite"),
    ("mixed", "mixed load: submits/s -> completed jobs/s", "-"),
    ("submits", "durable submits/s (p50 / p99)", ">= 5,000/s, p99 < 20 ms"),
    ("io", "I/O-bound jobs/s (x of 1 process, % of ideal)", ">= 1.8x at 2, >= 3.5x at 4, >= 80%"),
    ("sse", "status event on B after A's reply, under load (p50 / p99)", "p99 < 5 ms"),
    ("rescue", "kill -9 -> running again, defaults", "<= 2 s"),
    ("cost", "per job: statements, WAL, PG CPU, weft CPU", "-"),
]
PARTS = [f[0] for f in FIGURES]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else float("nan")


def ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def proc_stat(pid):
    """(ppid, CPU seconds of user and system time) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds(pids):
    return sum(stat[1] for stat in map(proc_stat, pids) if stat)


def die_with_parent():
    """In a child before exec: it gets SIGKILL if this script dies without stopping it."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def wait_for(predicate, timeout, what, interval=0.02):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# --- PostgreSQL ------------------------------------------------------------------------------

class Postgres:
    """A throw-away cluster, as the `postgres` user when run as root."""

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            sys.exit("PostgreSQL is not installed: run scripts/setup.sh")
        self.bin = bins[-1]
        self.root = tempfile.mkdtemp(prefix="weft-bench-pg-")
        self.port = free_port()
        self.data = os.path.join(self.root, "data")
        os.makedirs(os.path.join(self.root, "sockets"))
        self.as_user = []
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", self.root], check=True)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        subprocess.run(self.as_user + [f"{self.bin}/initdb", "-U", "postgres", "--auth=trust", "-D", self.data],
                       check=True, stdout=subprocess.DEVNULL)
        opts = (f"-p {self.port} -k {self.root}/sockets -c listen_addresses=127.0.0.1 -c max_connections=400 "
                "-c shared_preload_libraries=pg_stat_statements")
        subprocess.run(self.as_user + [f"{self.bin}/pg_ctl", "start", "-w", "-D", self.data, "-l",
                                       f"{self.root}/log", "-o", opts], check=True, stdout=subprocess.DEVNULL)

    def psql(self, db):
        return [f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
                "-qtA", "-F", SEP]

    def sql(self, sql, db="postgres"):
        """Rows of one statement, through a psql of its own."""
        out = subprocess.run(self.psql(db) + ["-c", f"{TAG} {sql}"], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"psql: {sql}: {out.stderr.strip()}")
        return [line.split(SEP) for line in out.stdout.splitlines() if line]

    def value(self, sql, db="postgres"):
        return self.sql(sql, db)[0][0]

    def database(self, name):
        """A fresh database with pg_stat_statements; its URL."""
        self.sql(f"CREATE DATABASE {name}")
        self.sql("CREATE EXTENSION pg_stat_statements", name)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def cpu_seconds(self):
        """CPU time of the postmaster and its children (the backends and helpers now alive)."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            postmaster = int(f.readline())
        pids = [postmaster] + [int(p) for p in os.listdir("/proc") if p.isdigit()
                               and (proc_stat(int(p)) or (None,))[0] == postmaster]
        return cpu_seconds(pids)

    def stop(self):
        subprocess.run(self.as_user + [f"{self.bin}/pg_ctl", "stop", "-m", "fast", "-D", self.data],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.root, ignore_errors=True)


class Session:
    """One psql kept open for frequent queries (counting jobs), without a process start per query."""

    MARK = "--bench-end--"

    def __init__(self, pg, db):
        self.proc = subprocess.Popen(pg.psql(db), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def query(self, sql):
        self.proc.stdin.write(f"{TAG} {sql};\n\\echo {self.MARK}\n")
        self.proc.stdin.flush()
        rows = []
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == self.MARK:
                return rows
            if line:
                rows.append(line.split(SEP))
        raise RuntimeError("psql session ended")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# --- weft processes ----------------------------------------------------------------------------

class Weft:
    """One `weft serve` process. Its stderr (errors only) is kept in its data dir until it stops."""

    def __init__(self, bench, role="all", database=None, workers=4):
        self.role = role
        self.data = tempfile.mkdtemp(prefix=f"weft-{role}-", dir=bench.root)
        args = [bench.binary, "serve", "--addr", "127.0.0.1:0", "--data-dir", self.data, "--role", role,
                "--workers", str(workers), "--queue-depth", "1000000", "--shutdown-grace-secs", "1",
                "--plugins-dir", bench.plugins, "--compile-cache", bench.compile_cache]
        if database:
            args += ["--database", database, "--blob-dir", bench.blobs]
        self.log = os.path.join(self.data, "stderr.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env={**os.environ, "WEFT_LOG": "error"}, preexec_fn=die_with_parent)
        self.host = self.port = None

    def wait_ready(self):
        for line in self.proc.stdout:
            if line.startswith("weft listening on http://"):
                self.host, port = line.strip().rsplit("/", 1)[1].split(":")
                self.port = int(port)
                break
        else:
            raise RuntimeError(f"weft ({self.role}) exited before listening: {self.errors()[:3]}")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        wait_for(lambda: self.healthy(), 300, f"weft ({self.role}) to become ready", 0.05)

    def healthy(self):
        try:
            return self.request("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def request(self, method, path, body=None, conn=None):
        c = conn or http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=HEADERS)
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        is_json = r.getheader("content-type", "").startswith("application/json")
        return r.status, (json.loads(data) if data and is_json else data.decode())

    def cpu_seconds(self):
        return cpu_seconds([self.proc.pid])

    def errors(self):
        try:
            with open(self.log) as f:
                return [line.strip() for line in f if line.strip()]
        except OSError:
            return []


# --- the run's context, deployments ----------------------------------------------------------------

class Bench:
    """The run: a copy of the binary, the PostgreSQL cluster, shared dirs, the live weft processes
    (all stopped by close()), the error lines they logged, and the figures for the summary."""

    def __init__(self, binary, seconds, jobs):
        self.seconds, self.jobs = seconds, jobs
        self.root = tempfile.mkdtemp(prefix="weft-bench-")
        self.binary = os.path.join(self.root, "weft")
        shutil.copy2(binary, self.binary)
        self.blobs, self.compile_cache, self.plugins = (os.path.join(self.root, d)
                                                        for d in ("blobs", "cache", "plugins"))
        for d in (self.blobs, self.compile_cache, self.plugins):
            os.makedirs(d)
        for wasm in PLUGINS:
            shutil.copy(os.path.join(WASM, wasm), self.plugins)
        self.live, self.errors, self.cells, self.databases = [], [], {}, 0
        self.pg = Postgres()

    def start(self, count, **kwargs):
        """`count` weft processes, started side by side, once all are ready."""
        procs = [Weft(self, **kwargs) for _ in range(count)]
        self.live += procs
        for p in procs:
            p.wait_ready()
        return procs

    def stop(self, procs, kill=False):
        procs = [p for p in dict.fromkeys(procs) if p in self.live]
        for p in procs:
            p.proc.kill() if kill else p.proc.terminate()
        deadline = time.time() + 3  # the grace is 1 s; a canceled HostileSleep can hold a process past it
        for p in procs:
            try:
                p.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
            self.errors += [(p.role, line) for line in p.errors()]
            shutil.rmtree(p.data, ignore_errors=True)
            self.live.remove(p)

    def database(self, part):
        self.databases += 1
        return self.pg.database(f"{part}{self.databases}")

    def note(self, part, column, text):
        self.cells.setdefault(part, {}).setdefault(column, []).append(text)

    def close(self):
        try:
            self.stop(list(self.live))
        finally:
            self.pg.stop()
            shutil.rmtree(self.root, ignore_errors=True)


class Deployment:
    """One SQLite process (`role all`), or on a fresh PostgreSQL database `apis` API processes and
    `worker_processes` worker processes of `workers` slots each. A context manager: stops them."""

    def __init__(self, bench, part, sqlite, worker_processes=1, workers=4, apis=1):
        self.bench, self.sqlite, self.lock = bench, sqlite, threading.Lock()
        if sqlite:
            self.label = f"SQLite, 1 process x {workers} workers"
            self.apis = self.workers = bench.start(1, workers=workers)
            self.slots = workers
            return
        self.label = f"PostgreSQL, {apis} api process(es)" + (
            f" + {worker_processes} worker process(es) x {workers} workers" if worker_processes else "")
        url = bench.database(part)
        self.db = url.rsplit("/", 1)[1]
        self.session = Session(bench.pg, self.db)
        self.apis = bench.start(apis, role="api", database=url)
        self.workers = bench.start(worker_processes, role="worker", database=url, workers=workers)
        self.slots = worker_processes * workers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bench.stop(self.apis + self.workers)
        if not self.sqlite:
            self.session.close()

    @property
    def targets(self):
        return [(a.host, a.port) for a in self.apis]

    def counts(self):
        """Jobs by status: from the database (PostgreSQL) or the process's /metrics (SQLite)."""
        with self.lock:
            if not self.sqlite:
                return {s: int(n) for s, n in self.session.query("SELECT status, count(*) FROM jobs GROUP BY 1")}
            _, text = self.apis[0].request("GET", "/metrics")
        return {line.split('"')[1]: int(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("weft_jobs{status=")}

    def done(self):
        counts = self.counts()
        return sum(counts.get(s, 0) for s in DONE)

    def hold_slots(self):
        """Every worker slot held by a sleeping job (or as many as run at once: says so when fewer);
        their ids, for release()."""
        ids = [self.apis[0].request("POST", "/api/v2/jobs", {"workflow": HOLD_GRAPH})[1]["id"]
               for _ in range(self.slots)]
        seen = []  # running jobs, a sample each 0.05 s: done when all run or none more for 2 s
        wait_for(lambda: seen.append(self.counts().get("running", 0)) or seen[-1] == self.slots
                 or (seen[-1] > 0 and len(seen) > 40 and seen[-41] == seen[-1]), 60, "the holding jobs to run", 0.05)
        if seen[-1] < self.slots:
            print(f"  ! {self.label}: only {seen[-1]} of {self.slots} worker slots ran sleeping jobs at once")
        return ids

    def release(self, ids):
        conn = http.client.HTTPConnection(self.apis[0].host, self.apis[0].port, timeout=60)
        for jid in ids:
            self.apis[0].request("POST", f"/api/v2/jobs/{jid}/cancel", None, conn)
        conn.close()

    def cpu(self):
        """CPU seconds of the weft processes that run jobs, and of PostgreSQL."""
        return sum(p.cpu_seconds() for p in self.workers), (0.0 if self.sqlite else self.bench.pg.cpu_seconds())


# --- load generation (client processes) -------------------------------------------------------------

def client_process(targets, offset, graph, threads, stop, backlog, cap, quota, out):
    """One load-generating process: `threads` keep-alive connections posting `graph` until `stop`
    is set or `quota` (shared) runs out, pausing while `backlog` (shared) is at `cap`. Puts its
    records, (finished at, latency s, HTTP status), on `out`."""
    body = json.dumps({"workflow": graph})
    records, lock = [], threading.Lock()

    def take():
        if quota is None:
            return True
        with quota.get_lock():
            quota.value -= 1
            return quota.value >= 0

    def loop(i):
        host, port = targets[(offset + i) % len(targets)]
        conn, mine = http.client.HTTPConnection(host, port, timeout=60), []
        while not stop.is_set():
            if cap and backlog.value >= cap:
                time.sleep(0.002)
                continue
            if not take():
                break
            t = time.perf_counter()
            try:
                conn.request("POST", "/api/v2/jobs", body, HEADERS)
                r = conn.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException):
                conn.close()
                status = 0
            mine.append((time.time(), time.perf_counter() - t, status))
        with lock:
            records.extend(mine)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    out.put(records)


class Load:
    """`processes` client processes of `threads` threads each (Python threads alone cannot push
    thousands of requests a second). A context manager: stops them."""

    def __init__(self, targets, graph, processes=3, threads=4, cap=0, quota=None):
        ctx = multiprocessing.get_context("spawn")
        self.stop_event, self.out = ctx.Event(), ctx.Queue()
        self.backlog = ctx.Value("i", 0, lock=False)
        self.quota = ctx.Value("i", quota) if quota else None  # kept: the clients unpickle it later
        self.procs = [ctx.Process(target=client_process, daemon=True,
                                  args=(targets, p * threads, graph, threads, self.stop_event, self.backlog,
                                        cap, self.quota, self.out)) for p in range(processes)]
        for p in self.procs:
            p.start()
        self.records = None

    def finish(self):
        """Waits for the clients to end (quota spent or stop set); all their records."""
        if self.records is None:
            self.records = [r for _ in self.procs for r in self.out.get(timeout=120)]
            for p in self.procs:
                p.join()
        return self.records

    def stop(self):
        self.stop_event.set()
        return self.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def submit_stats(records, since=0.0, until=float("inf")):
    """Submits/s, p50 and p99 latency (s) and failures of the records finished in [since, until]."""
    window = [r for r in records if since <= r[0] <= until]
    ok = [lat for _, lat, status in window if status == 201]
    span = (min(until, max(r[0] for r in window)) - max(since, min(r[0] for r in window))) if window else 0
    return {"rate": len(ok) / span if span > 0 else 0.0, "p50": pct(ok, 50), "p99": pct(ok, 99),
            "failed": len(window) - len(ok), "count": len(ok)}


class Monitor:
    """Samples a deployment's job counts every `interval` s in a thread, and keeps the load's shared
    backlog at the number of queued jobs. A context manager."""

    def __init__(self, dep, load=None, interval=0.1):
        self.dep, self.load, self.interval = dep, load, interval
        self.samples, self.stopped = [], threading.Event()  # (time, done, queued)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopped.is_set():
            t = time.time()
            counts = self.dep.counts()
            sample = ((t + time.time()) / 2, sum(counts.get(s, 0) for s in DONE), counts.get("queued", 0))
            self.samples.append(sample)
            if self.load:
                self.load.backlog.value = sample[2]
            self.stopped.wait(self.interval)

    def rate(self, since, until):
        """Completed jobs/s between the first sample after `since` and the last before `until`."""
        inside = [s for s in self.samples if since <= s[0] <= until]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def least_queued(self, since, until):
        return min((s[2] for s in self.samples if since <= s[0] <= until), default=0)

    def wait_started(self, timeout=60):
        """Waits until jobs complete (the first ones warm the plugins up)."""
        first = self.samples[-1][1] if self.samples else 0
        wait_for(lambda: bool(self.samples) and self.samples[-1][1] > first + 10, timeout, "jobs to complete", 0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()


def measure_window(bench, warmup=1.0):
    """Sleeps a warm-up, then the run's window; the window's (start, end)."""
    time.sleep(warmup)
    start = time.time()
    time.sleep(bench.seconds)
    return start, time.time()


def check_submits(stats, what):
    if stats["failed"]:
        print(f"  ! {stats['failed']} submits failed during {what}")


# --- the parts ----------------------------------------------------------------------------

def cost_before(bench, dep):
    """CPU times now; on PostgreSQL also the WAL position, with pg_stat_statements reset."""
    if dep.sqlite:
        return None, dep.cpu()
    bench.pg.sql("SELECT pg_stat_statements_reset()", dep.db)
    return bench.pg.value("SELECT pg_current_wal_lsn()"), dep.cpu()


def cost_per_job(bench, dep, before, jobs):
    """Per job since `before`: weft worker CPU ms; on PostgreSQL also its CPU ms, WAL bytes and
    statements, and the top statements by calls."""
    lsn, (weft_cpu, pg_cpu) = before
    weft_now, pg_now = dep.cpu()
    cost = {"weft_ms": (weft_now - weft_cpu) * 1000 / jobs, "pg_ms": (pg_now - pg_cpu) * 1000 / jobs, "jobs": jobs}
    if dep.sqlite:
        return cost
    mine = (f"dbid = (SELECT oid FROM pg_database WHERE datname = '{dep.db}') "
            f"AND query NOT LIKE '%bench-probe%'")
    calls = int(bench.pg.value(f"SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements WHERE {mine}", dep.db))
    wal = float(bench.pg.value(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')"))
    top = bench.pg.sql(f"SELECT calls, round(mean_exec_time::numeric, 3), "
                       f"left(regexp_replace(query, '\\s+', ' ', 'g'), 110) FROM pg_stat_statements "
                       f"WHERE {mine} ORDER BY calls DESC LIMIT 10", dep.db)
    return {**cost, "statements": calls / jobs, "wal": wal / jobs, "top": top}


def drain(bench, sqlite, processes=1):
    """Fills the queue with `bench.jobs` image jobs while every slot is held, releases the slots and
    times the drain. Returns the rate, failures and the cost per job."""
    with Deployment(bench, "drain", sqlite, processes, workers=4) as dep:
        held = dep.hold_slots()
        with Load(dep.targets, IMAGE_GRAPH, quota=bench.jobs) as load:
            check_submits(submit_stats(load.finish()), "the fill")
        done_before = dep.done()
        target = done_before + bench.jobs
        before = cost_before(bench, dep)
        started = time.time()
        dep.release(held)
        last, progress = done_before, time.time()
        while (now := dep.done()) < target:
            if now > last:
                last, progress = now, time.time()
            elif time.time() - progress > 30:
                print(f"  ! {dep.label}: drain stalled at {now - done_before} of {bench.jobs} jobs for 30 s")
                break
            time.sleep(0.02)
        elapsed = time.time() - started
        measured = now - done_before
        cost = cost_per_job(bench, dep, before, max(1, measured))
        return {"label": dep.label, "rate": measured / elapsed, "jobs": measured, "elapsed": elapsed,
                "failed": dep.counts().get("failed", 0), "cost": cost}


def part_drain(bench, runs):
    print("\n== 1. drain of trivial jobs: 3-node image graph, the queue filled first, then drained")
    for key, r in runs.items():
        print(f"  {r['label']}: {r['rate']:.0f} jobs/s ({r['jobs']} jobs in {r['elapsed']:.2f} s, "
              f"{r['failed']} failed)")
        bench.note("drain", "sqlite" if key == 0 else "pg", f"{r['rate']:.0f}" if key == 0 else
                   f"{key}p {r['rate']:.0f}")


def part_cost(bench, runs):
    print("\n== 7. cost per job of the drain (image graph), PostgreSQL with 1 worker process")
    if 0 in runs:
        c = runs[0]["cost"]
        print(f"  SQLite, 1 process: weft CPU {c['weft_ms']:.3f} ms per job ({c['jobs']} jobs)")
        bench.note("cost", "sqlite", f"weft {c['weft_ms']:.2f} ms CPU")
    c = runs[1]["cost"]
    print(f"  PostgreSQL ({c['jobs']} jobs): {c['statements']:.1f} statements, {c['wal']:.0f} WAL bytes, "
          f"PostgreSQL CPU {c['pg_ms']:.3f} ms, weft worker CPU {c['weft_ms']:.3f} ms per job")
    print("  top statements by calls: calls | mean ms | query")
    for calls, mean, query in c["top"]:
        print(f"    {int(calls):>7} | {float(mean):7.3f} | {query}")
    bench.note("cost", "pg", f"{c['statements']:.1f} stmts, {c['wal'] / 1024:.1f} KiB WAL, "
               f"PG {c['pg_ms']:.2f} ms, weft {c['weft_ms']:.2f} ms CPU")


def part_mixed(bench):
    print(f"\n== 2. drain while submitting: image jobs from 3 client processes x 4 threads, "
          f"{bench.seconds:.0f} s window")
    for sqlite, processes in [(True, 1), (False, 1), (False, 2), (False, 4)]:
        with Deployment(bench, "mixed", sqlite, processes, workers=4) as dep, \
                Load(dep.targets, IMAGE_GRAPH) as load, Monitor(dep) as mon:
            start, end = measure_window(bench)
            stats = submit_stats(load.stop(), start, end)
            done = mon.rate(start, end)
            queued = mon.samples[-1][2]
        check_submits(stats, "the window")
        print(f"  {dep.label}: {stats['rate']:.0f} submits/s (p99 {ms(stats['p99'])}), {done:.0f} jobs/s "
              f"completed; {queued} queued at the end")
        cell = f"{stats['rate']:.0f} -> {done:.0f}"
        bench.note("mixed", "sqlite" if sqlite else "pg", cell if sqlite else f"{processes}p {cell}")


def part_submits(bench):
    print(f"\n== 3. durable submits (SaveText graph), 4 client processes x 4 threads, {bench.seconds:.0f} s window")
    for sqlite, apis in [(True, 1), (False, 1), (False, 3)]:
        with Deployment(bench, "submits", sqlite, 0, workers=1, apis=apis) as dep:
            if sqlite:
                dep.hold_slots()  # the process then only takes submits, as an API process does
            with Load(dep.targets, TEXT_GRAPH, processes=4, threads=4) as load:
                start, end = measure_window(bench)
                stats = submit_stats(load.stop(), start, end)
        check_submits(stats, "the window")
        where = "one SQLite process (its slot held)" if sqlite else f"{apis} API process(es)"
        print(f"  through {where}: {stats['rate']:.0f}/s, p50 {ms(stats['p50'])}, p99 {ms(stats['p99'])}")
        cell = f"{stats['rate']:.0f}/s ({stats['p50'] * 1000:.1f} / {stats['p99'] * 1000:.1f} ms)"
        bench.note("submits", "sqlite" if sqlite else "pg", cell if sqlite else f"{apis} api {cell}")


def part_io(bench):
    ideal = IO_SLOTS / IO_SECONDS
    print(f"\n== 4. I/O-bound jobs: HostileSleep({IO_SECONDS} s) -> PreviewAny, {IO_SLOTS} workers a process, "
          f"{bench.seconds:.0f} s window; ideal {ideal:.0f} jobs/s a process; the queue filled to {IO_BACKLOG} first "
          f"and kept there by the clients")
    one = None
    for sqlite, processes in [(True, 1), (False, 1), (False, 2), (False, 4)]:
        with Deployment(bench, "io", sqlite, processes, workers=IO_SLOTS) as dep:
            held = dep.hold_slots()
            with Load(dep.targets, IO_GRAPH, cap=IO_BACKLOG) as load, Monitor(dep, load) as mon:
                wait_for(lambda: bool(mon.samples) and mon.samples[-1][2] >= IO_BACKLOG - 20, 60, "the queue to fill",
                         0.1)
                dep.release(held)
                mon.wait_started()
                start, end = measure_window(bench, warmup=0.5)
                rate, least = mon.rate(start, end), mon.least_queued(start, end)
                stats = submit_stats(load.stop())
            failed = dep.counts().get("failed", 0)
        check_submits(stats, "the run")
        share = rate / (ideal * processes) * 100
        if not sqlite and processes == 1:
            one = rate
        ratio = f", {rate / one:.2f}x of 1 process" if one and not sqlite else ""
        dry = " - the queue ran empty: bound by the submits" if least == 0 else ""
        print(f"  {dep.label}: {rate:.0f} jobs/s{ratio}, {share:.0f}% of ideal ({failed} failed; "
              f"never fewer than {least} queued{dry})")
        ratio_cell = f" {rate / one:.2f}x" if one and processes > 1 else ""
        cell = f"{rate:.0f}{ratio_cell} {share:.0f}%"
        bench.note("io", "sqlite" if sqlite else "pg", cell if sqlite else f"{processes}p {cell}")


def read_event(stream):
    """The next SSE event's (name, data); a status event's data is just its status."""
    name, data = None, ""
    while True:
        line = stream.readline().decode()
        if not line:
            raise RuntimeError("event stream ended")
        line = line.rstrip("\r\n")
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data += line.split(":", 1)[1]
        elif line == "" and (name or data):
            return name, (json.loads(data).get("status") if name == "status" else data)


def status_event_round(a, b):
    """A running job's cancel on A to its next status event (canceling or canceled) on B's stream:
    seconds from the request and after A's reply."""
    _, job = a.request("POST", "/api/v2/jobs", {"workflow": PROBE_GRAPH})
    conn = http.client.HTTPConnection(b.host, b.port, timeout=60)
    try:
        conn.request("GET", f"/api/v2/jobs/{job['id']}/events", headers={"accept": "text/event-stream"})
        stream = conn.getresponse()
        while read_event(stream) != ("status", "running"):  # the snapshot, then the job's start
            pass
        sent = time.perf_counter()
        a.request("POST", f"/api/v2/jobs/{job['id']}/cancel")
        replied = time.perf_counter()
        while read_event(stream)[0] != "status":
            pass
        got = time.perf_counter()
        return got - sent, max(0.0, got - replied)
    finally:
        conn.close()


def part_sse(bench, rounds=50):
    print(f"\n== 5. status event latency under load: cancel of a running job on A -> its status event on B's "
          f"stream ({rounds} rounds; image jobs submitted and drained meanwhile, queue up to {SSE_BACKLOG})")
    for sqlite in (True, False):
        with Deployment(bench, "sse", sqlite, 2, workers=4, apis=2) as dep, \
                Load(dep.targets, IMAGE_GRAPH, processes=2, threads=3, cap=SSE_BACKLOG) as load, \
                Monitor(dep, load) as mon:
            mon.wait_started()
            start = time.time()
            time.sleep(1.0)  # the background load settles
            a, b = dep.apis[0], dep.apis[-1]
            results = [status_event_round(a, b) for _ in range(rounds)]
            drained = mon.rate(start, time.time())
        from_send, from_reply = [r[0] for r in results], [r[1] for r in results]
        where = "A = B, the SQLite process" if sqlite else "A and B two API processes, 2 worker processes"
        print(f"  {where} (background {drained:.0f} jobs/s): p50 {ms(pct(from_reply, 50))}, "
              f"p99 {ms(pct(from_reply, 99))} after A's reply; p50 {ms(pct(from_send, 50))}, "
              f"p99 {ms(pct(from_send, 99))} from sending the cancel")
        bench.note("sse", "sqlite" if sqlite else "pg",
                   f"{pct(from_reply, 50) * 1000:.1f} / {pct(from_reply, 99) * 1000:.1f} ms")


def part_rescue(bench):
    print("\n== 6. kill -9 of the worker process running a job (SlowCounter), default settings")
    with Deployment(bench, "rescue", False, 2, workers=1) as dep:
        jid = dep.apis[0].request("POST", "/api/v2/jobs", {"workflow": SLOW_GRAPH})[1]["id"]

        def state():  # (status, claimed_by or "-")
            return dep.session.query(f"SELECT status, COALESCE(claimed_by, '-') FROM jobs WHERE id = '{jid}'")[0]

        wait_for(lambda: state()[0] == "running", 60, "the slow job to run")
        owner = state()[1]
        doomed = next(w for w in dep.workers if owner.startswith(f"{w.proc.pid}-"))
        killed = time.time()
        bench.stop([doomed], kill=True)
        requeued = running = None
        while time.time() - killed < RESCUE_TIMEOUT:
            status, owner = state()
            mine = owner.startswith(f"{doomed.proc.pid}-")
            if requeued is None and (status == "queued" or not mine):
                requeued = time.time() - killed
            if status == "running" and not mine and owner != "-":
                running = time.time() - killed
                break
            time.sleep(0.02)
    if running is None:
        print(f"  not running again within {RESCUE_TIMEOUT:.0f} s"
              + (f" (queued again after {requeued:.2f} s)" if requeued else " (not even queued again)"))
        bench.note("rescue", "pg", f"> {RESCUE_TIMEOUT:.0f} s")
        return
    print(f"  rescued (queued again) after {requeued:.2f} s, running on the other worker after {running:.2f} s")
    bench.note("rescue", "pg", f"{running:.2f} s")


# --- main ----------------------------------------------------------------------------------

def summary(bench):
    rows = [("figure", "SQLite 1 process", "PostgreSQL", "goal")]
    for part, figure, goal in FIGURES:
        if part in bench.cells:
            cells = bench.cells[part]
            rows.append((figure, "; ".join(cells.get("sqlite", ["n/a"])), "; ".join(cells.get("pg", ["-"])), goal))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print("\n== summary (1p, 2p, 4p: worker processes)")
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def report_errors(bench):
    if not bench.errors:
        print("\nweft processes logged no errors")
        return
    print(f"\nweft processes logged {len(bench.errors)} error line(s); the first ones:")
    for role, line in bench.errors[:10]:
        print(f"  [{role}] {line[:300]}")


def run(bench, only):
    wanted = lambda part: only in (None, part)
    if wanted("drain") or wanted("cost"):
        counts = (0, 1, 2, 4) if wanted("drain") else (0, 1)
        runs = {n: drain(bench, n == 0, max(1, n)) for n in counts}
        if wanted("drain"):
            part_drain(bench, runs)
        if wanted("cost"):
            part_cost(bench, runs)
    for part, fn in [("mixed", part_mixed), ("submits", part_submits), ("io", part_io), ("sse", part_sse),
                     ("rescue", part_rescue)]:
        if wanted(part):
            fn(bench)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weft", help="the weft binary (default: target/release/weft, else target/debug/weft)")
    ap.add_argument("--seconds", type=float, default=4.0, help="the measuring window of each run")
    ap.add_argument("--jobs", type=int, default=3000, help="jobs each drain empties")
    ap.add_argument("--only", choices=PARTS)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop the processes and the cluster on these too
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    binary = args.weft or next((p for p in (f"{ROOT}/target/release/weft", f"{ROOT}/target/debug/weft")
                                if os.path.exists(p)), None)
    if not binary:
        sys.exit("build weft first (cargo build --release)")
    missing = [w for w in PLUGINS if not os.path.exists(os.path.join(WASM, w))]
    if missing:
        sys.exit(f"missing test plugins {missing}: run ./scripts/build-wasm.sh test")
    print(f"weft: {binary}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the start; "
          "figures are noisy on a shared machine")
    started = time.time()
    bench = Bench(binary, args.seconds, args.jobs)
    try:
        run(bench, args.only)
        summary(bench)
        report_errors(bench)
    finally:
        bench.close()
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end; {time.time() - started:.0f} s in all")


if __name__ == "__main__":
    main()
