#!/usr/bin/env python3
"""ComfyUI's stock default graph on the SD1.5-layout random checkpoint, through weft's job API,
then `weft models generate` with the same settings, on the same machine, one after the other.

Prints each node class's time (from the server's own `weft_node_duration_seconds` metrics),
the end-to-end time seen by the client (submit to `succeeded`, checkpoint load included),
the time of `weft models generate`, and the node path's overhead over it.

    python3 scripts/bench-sd15-graph.py [--family sd15|sdxl] [--weft target/release/weft]
        [--size 512 [--size 1024 ...]] [--steps 20] [--batch 1] [--rounds N] [--no-generate]
        [--min-free-gib G] [--save-images DIR [--label PREFIX]]
        [--comfyui DIR --comfyui-python PYTHON [--comfyui-args ARGS]]

`--rounds N` runs the job API and `generate` N times each, alternating which goes first, and
prints the best of each: this VM's speed drifts between runs minutes apart, and whichever
process first faults in gigabytes after the other freed its own pays more for it.

With `--comfyui`, ComfyUI itself (a checkout of its tree in DIR, run by PYTHON, an interpreter
with torch and ComfyUI's requirements) then runs the same graph on the CPU through its own
`/prompt` API, with the same checkpoint, and the script prints its end-to-end time, its time
per sampler step (from its progress bar) and weft's speed-up over it. `--comfyui-args` replaces
the arguments that choose its device and precision (default `--cpu`; `""` lets it take a GPU
with its own default precision, `--force-fp32` takes the GPU in float32 as weft computes).

`--family sdxl` runs the same graph on the SDXL-layout random checkpoint instead. Each run
prints the load average when it starts and ends, its time per sampler step (from the client's
clock: step N's progress against step 1's, so the first step and all loading stay out), and
its server's peak resident memory (VmHWM). With `--comfyui` and `--rounds N`, each round runs
weft, then ComfyUI, every process exiting before the next starts; `--no-generate` leaves
`weft models generate` out; `--min-free-gib G` waits before each run until the machine has G
GiB available (models this size held twice at once would not fit). `--size` given more than
once runs every size in turn.

The checkpoints (2.1 GB, `weft models sd15-random --seed 0`; 6.9 GB, `weft models sdxl-random
--seed 0`) are built once in $WEFT_CACHE_DIR (default ~/.cache/weft) and shared with the parity
tests.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

PROMPT = "beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"
NEGATIVE = "text, watermark"
SEED = 156680208700286


# Per family: the name the graph loads, the `weft models` command that writes the checkpoint,
# and the cached file's name (named by its sha256).
FAMILIES = {
    "sd15": ("sd15-random-s0.safetensors", "sd15-random", "sd15-random-s0-aa64b29d75cc.safetensors"),
    "sdxl": ("sdxl-random-s0.safetensors", "sdxl-random", "sdxl-random-s0-937a6c69eb0d.safetensors"),
}


def graph(ckpt_name, size, steps, batch=1):
    return {
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": SEED, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt_name}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": batch, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": PROMPT}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": NEGATIVE}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    }


def checkpoint(weft, family):
    name, command, cached = FAMILIES[family]
    cache = os.environ.get("WEFT_CACHE_DIR") or os.path.expanduser("~/.cache/weft")
    shared = os.path.join(cache, cached)
    if not os.path.exists(shared):
        os.makedirs(cache, exist_ok=True)
        subprocess.run([weft, "models", command, "--seed", "0", "--out", shared], check=True)
    models = os.path.join(cache, "bench-models")
    inside = os.path.join(models, "checkpoints", name)
    if not os.path.exists(inside):
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        link_or_copy(shared, inside)  # a name inside the folder; symlinks out of it are refused
    return models, inside


def link_or_copy(source, target):
    """Makes `target` a hard link to `source`, or a copy where the two cannot share a file."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def wait_for_memory(gib):
    """Waits, polling every 30 s, until the machine has `gib` GiB available."""
    while available_gib() < gib:
        print(f"  waiting: {available_gib():.1f} GiB available, {gib} wanted", flush=True)
        time.sleep(30)


def load_average():
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def peak_rss_gib(pid):
    """The peak resident memory (VmHWM) of process `pid`, in GiB, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def per_step(times, steps):
    """Seconds a step from `times` (step number -> when it was first seen): the last step seen
    against the first seen after step 0, so that neither loading nor the first step counts
    (a fast sampler's progress events may skip steps)."""
    seen = sorted(step for step in times if step >= 1)
    if steps < 2 or len(seen) < 2:
        return None
    first, last = seen[0], seen[-1]
    return (times[last] - times[first]) / (last - first)


def request(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return json.loads(raw) if r.headers.get("content-type", "").startswith("application/json") else raw.decode()


def wait_until_up(url, seconds):
    """Waits up to `seconds` for `url` to answer a GET."""
    for _ in range(int(seconds * 10)):
        try:
            request(url)
            return
        except OSError:
            time.sleep(0.1)


def follow_until_done(url, step_times):
    """Reads the job event stream at `url` until its terminal `status` event; returns that
    event's job. Notes in `step_times` when each `KSampler` step was first reported."""
    terminal = ("succeeded", "failed", "canceled", "expired")
    with urllib.request.urlopen(url, timeout=3600) as stream:
        event = None
        for raw in stream:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line[len("event:"):].strip()
            elif line.startswith("data:") and event == "status":
                job = json.loads(line[len("data:"):])
                if job.get("status") in terminal:
                    return job
            elif line.startswith("data:") and event == "progress":
                progress = json.loads(line[len("data:"):])
                if progress.get("current_node_class") == "KSampler" and progress.get("step"):
                    step_times.setdefault(progress["step"], time.perf_counter())
    return None


def node_seconds(metrics):
    sums = {}
    for line in metrics.splitlines():
        m = re.match(r'weft_node_duration_seconds_sum\{class="([^"]+)"\} ([0-9.eE+-]+)', line)
        if m:
            sums[m.group(1)] = float(m.group(2))
    return sums


def via_job_api(weft, models, workflow, steps, save=None):
    """weft's server on `workflow`: end-to-end seconds, node seconds, seconds a sampler step,
    the server's peak resident GiB. With `save`, the first PNG it made is written there."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            [weft, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", data, "--models-dir", models,
             "--cache-mib", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_up(base + "/healthz", 60)
            began = time.perf_counter()
            job = request(base + "/api/v2/jobs", {"workflow": workflow})
            # The client follows the job's event stream, which costs the server nothing
            # between events, where polling would take CPU from the sampler on a small machine.
            step_times = {}
            job = follow_until_done(f"{base}/api/v2/jobs/{job['id']}/events", step_times) or job
            took = time.perf_counter() - began
            if job["status"] != "succeeded":
                sys.exit(f"the job did not succeed: {job}")
            nodes = node_seconds(request(base + "/metrics"))
            if save:
                for output in job.get("outputs", []):
                    with urllib.request.urlopen(urllib.parse.urljoin(base + "/", output["url"]), timeout=60) as r:
                        png = r.read()
                    if png.startswith(b"\x89PNG"):
                        with open(save, "wb") as f:
                            f.write(png)
                        break
            return took, nodes, per_step(step_times, steps), peak_rss_gib(server.pid)
        finally:
            server.terminate()
            server.wait()


def via_generate(weft, ckpt, size, steps):
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        subprocess.run(
            [weft, "models", "generate", "--checkpoint", ckpt, "--prompt", PROMPT, "--negative", NEGATIVE,
             "--seed", str(SEED), "--steps", str(steps), "--cfg", "8", "--width", str(size), "--height", str(size),
             "--sampler", "euler", "--scheduler", "normal", "--out", os.path.join(out, "image.png")],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - began


def via_comfyui(root, python, device_args, ckpt, workflow, steps, save=None):
    """ComfyUI's own server (`main.py` with `device_args`) on the same graph: end-to-end seconds (submit
    to the prompt in `/history`, checkpoint load included), seconds per sampler step (its progress
    bar's step N against step 1, as the client saw them appear in its log) and its peak resident
    GiB. With `save`, the first PNG it made is copied there."""
    inside = os.path.join(root, "models", "checkpoints", os.path.basename(ckpt))
    if not os.path.exists(inside):
        link_or_copy(ckpt, inside)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as out, open(os.path.join(out, "comfyui.log"), "w+") as log:
        server = subprocess.Popen(
            [python, "main.py", *device_args, "--listen", "127.0.0.1", "--port", str(port), "--output-directory", out],
            cwd=root, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_up(base + "/system_stats", 120)
            began = time.perf_counter()
            prompt_id = request(base + "/prompt", {"prompt": workflow})["prompt_id"]
            step_times = {}
            # Four polls a second: under 0.3% of ComfyUI's run, and little CPU taken from it.
            while True:
                note_progress_bar(log.name, steps, step_times)
                try:
                    history = request(f"{base}/history/{prompt_id}")
                except ConnectionResetError:  # a busy server may drop a poll; the next one asks again
                    history = {}
                if prompt_id in history:
                    break
                if server.poll() is not None:
                    sys.exit(f"ComfyUI exited with status {server.returncode}")
                time.sleep(0.25)
            took = time.perf_counter() - began
            status = history[prompt_id].get("status", {})
            if status.get("status_str", "success") != "success":
                sys.exit(f"ComfyUI's prompt did not succeed: {status}")
            pngs = sorted(name for name in os.listdir(out) if name.endswith(".png"))
            if save and pngs:
                shutil.copyfile(os.path.join(out, pngs[0]), save)
            return took, per_step(step_times, steps) or final_rate(log, steps), peak_rss_gib(server.pid)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        finally:
            server.terminate()
            server.wait()


def note_progress_bar(log_path, steps, step_times):
    """Notes in `step_times` when each step of ComfyUI's sampler progress bar first appeared in
    its log at `log_path`."""
    with open(log_path) as f:
        text = f.read()
    for step in re.findall(r"(\d+)/{steps} \[".format(steps=steps), text):
        step_times.setdefault(int(step), time.perf_counter())


def final_rate(log, steps):
    """Seconds a step from the rate on ComfyUI's finished progress bar, or None."""
    log.seek(0)
    # tqdm prints seconds per step when a step takes over a second, else steps per second.
    rates = re.findall(r"{steps}/{steps} \[[^,]*, *([0-9.]+)(s/it|it/s)\]".format(steps=steps), log.read())
    if not rates:
        return None
    value, unit = rates[-1]
    return float(value) if unit == "s/it" else 1 / float(value)


def timed_run(label, min_free_gib, run):
    """Waits for memory, then calls `run`, printing the load average before and after."""
    wait_for_memory(min_free_gib)
    print(f"{label}: starts at {load_average()}, {available_gib():.1f} GiB available", flush=True)
    result = run()
    print(f"{label}: ends at {load_average()}", flush=True)
    return result


def describe_step(seconds, rss):
    step = f", {seconds:.3f} s a sampler step" if seconds else ""
    peak = f", peak RSS {rss:.2f} GiB" if rss else ""
    return step + peak


def weft_round(args, models, ckpt, workflow, api_first):
    """One round of weft's job API and (unless `--no-generate`) `weft models generate`:
    the job API's end-to-end seconds and seconds a step, and generate's seconds or None."""
    def generate():
        took = timed_run("weft models generate", args.min_free_gib,
                         lambda: via_generate(args.weft, ckpt, args.size, args.steps))
        print(f"weft models generate:      {took:8.2f} s", flush=True)
        return took
    direct = None
    if not api_first and not args.no_generate:
        direct = generate()
    save = image_path(args, "weft")
    took, nodes, step, rss = timed_run("weft job API", args.min_free_gib,
                                       lambda: via_job_api(args.weft, models, workflow, args.steps, save))
    for name, seconds in sorted(nodes.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} {seconds:8.2f} s")
    print(f"job API, end to end:       {took:8.2f} s ({(took - nodes.get('KSampler', 0)) :.2f} s outside KSampler"
          f"{describe_step(step, rss)})", flush=True)
    if api_first and not args.no_generate:
        direct = generate()
    if direct:
        print(f"node path overhead:        {100 * (took / direct - 1):+8.2f} %")
    return took, step, direct


def comfyui_round(args, ckpt, workflow, device_args, weft_took, weft_step):
    """One run of ComfyUI with `device_args`; prints weft's speed-up over it. Returns its seconds a
    step."""
    save = image_path(args, "comfyui" + re.sub(r"[^A-Za-z0-9.]+", "-", device_args))
    took, step, rss = timed_run(f"ComfyUI {device_args!r}", args.min_free_gib, lambda: via_comfyui(
        args.comfyui, args.comfyui_python, shlex.split(device_args), ckpt, workflow, args.steps, save))
    print(f"ComfyUI {device_args!r}, end to end: {took:8.2f} s{describe_step(step, rss)}")
    print(f"weft's job API against it: {took / weft_took:8.2f}x faster end to end", end="")
    print(f", {step / weft_step:.2f}x a sampler step" if step and weft_step else "", flush=True)
    return step


def image_path(args, who):
    """Where `--save-images` puts the image of `who` in the current size and batch, or None."""
    if not args.save_images:
        return None
    os.makedirs(args.save_images, exist_ok=True)
    name = f"{args.label}{who}-{args.family}-{args.size}-b{args.batch}.png"
    return os.path.join(args.save_images, name)


def bench_size(args, models, ckpt):
    name = FAMILIES[args.family][0]
    workflow = graph(name, args.size, args.steps, args.batch)
    print(f"default graph on {name}, {args.size}x{args.size}, batch {args.batch}, {args.steps} steps, "
          f"euler/normal, cfg 8, on {os.cpu_count()} CPUs", flush=True)
    tooks, steps, directs, comfy_steps = [], [], [], []
    for turn in range(args.rounds):
        print(f"round {turn + 1}")
        # Every other round starts with `generate`, so that neither path is always the
        # first to fault its weights in after the other freed its own.
        took, step, direct = weft_round(args, models, ckpt, workflow, api_first=turn % 2 == 0)
        tooks.append(took)
        steps += [step] if step else []
        directs += [direct] if direct else []
        for device_args in (args.comfyui_args or ["--cpu"]) if args.comfyui else []:
            comfy_step = comfyui_round(args, ckpt, workflow, device_args, took, step)
            comfy_steps += [comfy_step] if comfy_step else []
    if args.rounds > 1:
        best = f"best of {args.rounds}: job API {min(tooks):.2f} s"
        best += f", generate {min(directs):.2f} s, node path overhead " \
                f"{100 * (min(tooks) / min(directs) - 1):+.2f} %" if directs else ""
        best += f"; a sampler step: weft {min(steps):.3f} s" if steps else ""
        best += f", ComfyUI {min(comfy_steps):.3f} s ({min(comfy_steps) / min(steps):.2f}x)" \
            if steps and comfy_steps else ""
        print(best, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="sd15")
    parser.add_argument("--weft", default="target/release/weft")
    parser.add_argument("--size", type=int, action="append", help="width and height (default 512); repeatable")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1, help="images per latent batch (default 1)")
    parser.add_argument("--save-images", metavar="DIR",
                        help="write each run's first image to DIR (weft's and ComfyUI's, by size and batch)")
    parser.add_argument("--label", default="", help="prefix of the image names --save-images writes")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the job API and `generate` (and ComfyUI), alternating which goes first")
    parser.add_argument("--no-generate", action="store_true", help="leave `weft models generate` out")
    parser.add_argument("--min-free-gib", type=float, default=0,
                        help="before each run, wait until the machine has this much memory available")
    parser.add_argument("--comfyui", help="a ComfyUI tree to run the same graph on, for comparison")
    parser.add_argument("--comfyui-python", default=sys.executable)
    parser.add_argument("--comfyui-args", action="append",
                        help="ComfyUI's device and precision arguments (default --cpu); "
                             "given again, ComfyUI runs once more with each")
    args = parser.parse_args()
    models, ckpt = checkpoint(args.weft, args.family)
    # Every run starts with the checkpoint in the page cache, so that none of them times
    # the disk (a freshly written file may have been evicted).
    with open(ckpt, "rb") as f:
        while f.read(1 << 24):
            pass
    for size in args.size or [512]:
        args.size = size
        bench_size(args, models, ckpt)


if __name__ == "__main__":
    main()
