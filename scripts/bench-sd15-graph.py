#!/usr/bin/env python3
"""ComfyUI's stock default graph on the SD1.5-layout random checkpoint, through weft's job API,
then `weft models generate` with the same settings, on the same machine, one after the other.

Prints each node class's time (from the server's own `weft_node_duration_seconds` metrics),
the end-to-end time seen by the client (submit to `succeeded`, checkpoint load included),
the time of `weft models generate`, and the node path's overhead over it.

    python3 scripts/bench-sd15-graph.py [--weft target/release/weft] [--size 512] [--steps 20]
        [--rounds N] [--comfyui DIR --comfyui-python PYTHON [--comfyui-args ARGS]]

`--rounds N` runs the job API and `generate` N times each, alternating which goes first, and
prints the best of each: this VM's speed drifts between runs minutes apart, and whichever
process first faults in gigabytes after the other freed its own pays more for it.

With `--comfyui`, ComfyUI itself (a checkout of its tree in DIR, run by PYTHON, an interpreter
with torch and ComfyUI's requirements) then runs the same graph on the CPU through its own
`/prompt` API, with the same checkpoint, and the script prints its end-to-end time, its time
per sampler step (from its progress bar) and weft's speed-up over it. `--comfyui-args` replaces
the arguments that choose its device and precision (default `--cpu`; `""` lets it take a GPU
with its own default precision, `--force-fp32` takes the GPU in float32 as weft computes).

The checkpoint (2.1 GB, `weft models sd15-random --seed 0`) is built once in
$WEFT_CACHE_DIR (default ~/.cache/weft) and shared with the parity test.
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
import urllib.request

PROMPT = "beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"
NEGATIVE = "text, watermark"
SEED = 156680208700286


def graph(size, steps):
    return {
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": SEED, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15-random-s0.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": PROMPT}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": NEGATIVE}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    }


def checkpoint(weft):
    cache = os.environ.get("WEFT_CACHE_DIR") or os.path.expanduser("~/.cache/weft")
    shared = os.path.join(cache, "sd15-random-s0-aa64b29d75cc.safetensors")  # named by its sha256
    if not os.path.exists(shared):
        os.makedirs(cache, exist_ok=True)
        subprocess.run([weft, "models", "sd15-random", "--seed", "0", "--out", shared], check=True)
    models = os.path.join(cache, "bench-models")
    inside = os.path.join(models, "checkpoints", "sd15-random-s0.safetensors")
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


def follow_until_done(url):
    """Reads the job event stream at `url` until its terminal `status` event; returns that
    event's job."""
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
    return None


def node_seconds(metrics):
    sums = {}
    for line in metrics.splitlines():
        m = re.match(r'weft_node_duration_seconds_sum\{class="([^"]+)"\} ([0-9.eE+-]+)', line)
        if m:
            sums[m.group(1)] = float(m.group(2))
    return sums


def via_job_api(weft, models, size, steps):
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
            job = request(base + "/api/v2/jobs", {"workflow": graph(size, steps)})
            # The client follows the job's event stream, which costs the server nothing
            # between events, where polling would take CPU from the sampler on a small machine.
            job = follow_until_done(f"{base}/api/v2/jobs/{job['id']}/events") or job
            took = time.perf_counter() - began
            if job["status"] != "succeeded":
                sys.exit(f"the job did not succeed: {job}")
            return took, node_seconds(request(base + "/metrics"))
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


def via_comfyui(root, python, device_args, ckpt, size, steps):
    """ComfyUI's own server (`main.py` with `device_args`) on the same graph: end-to-end seconds (submit
    to the prompt in `/history`, checkpoint load included) and seconds per sampler step."""
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
            prompt_id = request(base + "/prompt", {"prompt": graph(size, steps)})["prompt_id"]
            # Four polls a second: under 0.3% of ComfyUI's run, and little CPU taken from it.
            while True:
                history = request(f"{base}/history/{prompt_id}")
                if prompt_id in history:
                    break
                time.sleep(0.25)
            took = time.perf_counter() - began
            status = history[prompt_id].get("status", {})
            if status.get("status_str", "success") != "success":
                sys.exit(f"ComfyUI's prompt did not succeed: {status}")
            log.seek(0)
            # tqdm prints seconds per step when a step takes over a second, else steps per second.
            rates = re.findall(r"{steps}/{steps} \[[^,]*, *([0-9.]+)(s/it|it/s)\]".format(steps=steps), log.read())
            if not rates:
                return took, None
            value, unit = rates[-1]
            return took, float(value) if unit == "s/it" else 1 / float(value)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        finally:
            server.terminate()
            server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weft", default="target/release/weft")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the job API and `generate`, alternating which goes first")
    parser.add_argument("--comfyui", help="a ComfyUI tree to run the same graph on, for comparison")
    parser.add_argument("--comfyui-python", default=sys.executable)
    parser.add_argument("--comfyui-args", action="append",
                        help="ComfyUI's device and precision arguments (default --cpu); "
                             "given again, ComfyUI runs once more with each")
    args = parser.parse_args()
    models, ckpt = checkpoint(args.weft)
    # Every run starts with the checkpoint in the page cache, so that none of them times
    # the disk (a freshly written file may have been evicted).
    with open(ckpt, "rb") as f:
        while f.read(1 << 24):
            pass
    print(f"default graph, {args.size}x{args.size}, {args.steps} steps, euler/normal, cfg 8, on {os.cpu_count()} CPUs")
    tooks, directs = [], []
    for turn in range(args.rounds):
        # Every other round starts with `generate`, so that neither path is always the
        # first to fault its 4.3 GB of weights in after the other freed its own.
        api_first = turn % 2 == 0
        if not api_first:
            directs.append(via_generate(args.weft, ckpt, args.size, args.steps))
            print(f"weft models generate:      {directs[-1]:8.2f} s")
        took, nodes = via_job_api(args.weft, models, args.size, args.steps)
        tooks.append(took)
        for name, seconds in sorted(nodes.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<24} {seconds:8.2f} s")
        print(f"job API, end to end:       {took:8.2f} s ({(took - nodes.get('KSampler', 0)) :.2f} s outside KSampler)")
        if api_first:
            directs.append(via_generate(args.weft, ckpt, args.size, args.steps))
            print(f"weft models generate:      {directs[-1]:8.2f} s")
        print(f"node path overhead:        {100 * (tooks[-1] / directs[-1] - 1):+8.2f} % (round {turn + 1})")
    took = min(tooks)
    if args.rounds > 1:
        print(f"best of {args.rounds}: job API {took:.2f} s, generate {min(directs):.2f} s, "
              f"node path overhead {100 * (took / min(directs) - 1):+.2f} %")
    for device_args in (args.comfyui_args or ["--cpu"]) if args.comfyui else []:
        comfy, per_step = via_comfyui(args.comfyui, args.comfyui_python, shlex.split(device_args), ckpt,
                                      args.size, args.steps)
        step = f" ({per_step:.3f} s a sampler step)" if per_step else ""
        print(f"ComfyUI {device_args!r}, end to end: {comfy:8.2f} s{step}")
        print(f"weft's job API against it: {comfy / took:8.2f}x faster")


if __name__ == "__main__":
    main()
