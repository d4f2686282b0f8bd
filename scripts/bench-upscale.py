#!/usr/bin/env python3
"""ImageUpscaleWithModel on a 512x512 image with a full-size ESRGAN (RRDBNet: 64 features,
23 blocks, 4x; random weights), weft against ComfyUI (spandrel) on the CPU, side by side.

    /path/to/comfy-venv/bin/python scripts/bench-upscale.py --comfyui /path/to/ComfyUI \
        [--weft target/release/weft] [--rounds 3] [--size 512]

Makes the random-weight model with spandrel's own RRDBNet (once, in a temporary models
folder), starts weft's server over it, then alternates, round by round: one job through
weft's HTTP API (EmptyImage -> UpscaleModelLoader -> ImageUpscaleWithModel -> SaveImage; the
upscale node's own time read from the server's `weft_node_duration_seconds` metrics, and the
whole job's as the client saw it), and ComfyUI's `ImageUpscaleWithModel.execute` called
in-process on the same image (torch on all cores, float32). Prints every time, the best of
each, the ratio, and the load average before and after (other work on the machine slows
both sides alike only if it lasts the whole run).

Run with ComfyUI's interpreter (it needs torch, spandrel and ComfyUI importable).
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--comfyui", required=True, help="ComfyUI's tree")
    p.add_argument("--weft", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "weft"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=512)
    return p.parse_args()


def import_comfyui(root):
    """ComfyUI imported as a library, on the CPU."""
    os.chdir(root)
    sys.path.insert(0, root)
    sys.argv = ["x", "--cpu"]
    import utils.install_util  # noqa: F401  (must come first)
    import comfy.options

    comfy.options.enable_args_parsing()
    import nodes  # noqa: F401
    import comfy_extras.nodes_upscale_model as m

    return m


def make_model(folder):
    """A random-weight RRDBNet (64 features, 23 blocks, 4x) saved in `folder`."""
    import torch
    from safetensors.torch import save_file
    from spandrel.architectures.ESRGAN import ESRGAN

    torch.manual_seed(0)
    net = ESRGAN(num_filters=64, num_blocks=23, scale=4)
    path = os.path.join(folder, "rrdb-64nf-23nb-x4.safetensors")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, path)
    return os.path.basename(path)


def request(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        raw = r.read()
        return json.loads(raw) if r.headers.get("content-type", "").startswith("application/json") else raw.decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_seconds(base, cls):
    for line in request(base + "/metrics").splitlines():
        m = re.match(r'weft_node_duration_seconds_sum\{class="([^"]+)"\} ([0-9.eE+-]+)', line)
        if m and m.group(1) == cls:
            return float(m.group(2))
    return 0.0


def weft_round(base, model, size):
    """One job: (the upscale node's seconds, the whole job's seconds)."""
    workflow = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": 1, "color": 0x336699}},
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": model}},
        "3": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"filename_prefix": "up", "images": ["3", 0]}},
    }
    before = node_seconds(base, "ImageUpscaleWithModel")
    began = time.perf_counter()
    job = request(base + "/api/v2/jobs", {"workflow": workflow})
    while job["status"] not in ("succeeded", "failed", "canceled", "expired"):
        time.sleep(0.2)
        job = request(f"{base}/api/v2/jobs/{job['id']}")
    took = time.perf_counter() - began
    if job["status"] != "succeeded":
        sys.exit(f"weft's job did not succeed: {job}")
    return node_seconds(base, "ImageUpscaleWithModel") - before, took


def comfyui_round(m, descriptor, image):
    began = time.perf_counter()
    out = m.ImageUpscaleWithModel.execute(descriptor, image)[0]
    took = time.perf_counter() - began
    assert out.shape[1] == image.shape[1] * 4
    return took


def main():
    args = parse()
    weft = os.path.abspath(args.weft)
    m = import_comfyui(os.path.abspath(args.comfyui))
    import torch
    import comfy.utils
    from spandrel import ModelLoader

    with tempfile.TemporaryDirectory() as models, tempfile.TemporaryDirectory() as data:
        folder = os.path.join(models, "upscale_models")
        os.makedirs(folder)
        model = make_model(folder)
        sd = comfy.utils.load_torch_file(os.path.join(folder, model), safe_load=True)
        descriptor = ModelLoader().load_from_state_dict(sd).eval()
        colour = torch.tensor([0x33, 0x66, 0x99], dtype=torch.float32) / 255.0
        image = colour.expand(1, args.size, args.size, 3).contiguous()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [weft, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", data, "--models-dir", models,
             "--cache-mib", "0", "--node-timeout-ms", str(3600 * 1000)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    request(base + "/healthz")
                    break
                except OSError:
                    time.sleep(0.1)
            print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average before: "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            weft_times, job_times, comfy_times = [], [], []
            for r in range(args.rounds):
                order = ("weft", "comfyui") if r % 2 == 0 else ("comfyui", "weft")
                for who in order:
                    if who == "weft":
                        node, job = weft_round(base, model, args.size)
                        weft_times.append(node)
                        job_times.append(job)
                        print(f"round {r + 1}: weft node {node:.2f} s (job {job:.2f} s)", flush=True)
                    else:
                        t = comfyui_round(m, descriptor, image)
                        comfy_times.append(t)
                        print(f"round {r + 1}: ComfyUI {t:.2f} s", flush=True)
        finally:
            server.terminate()
            server.wait()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    best_weft, best_job, best_comfy = min(weft_times), min(job_times), min(comfy_times)
    print(f"load average after: {load}")
    print(f"best: weft {best_weft:.2f} s (whole job {best_job:.2f} s), ComfyUI {best_comfy:.2f} s")
    print(f"weft is {best_comfy / best_weft:.2f}x ComfyUI's speed "
          f"({best_comfy / best_job:.2f}x counting weft's whole job: model load and PNG save included)")


if __name__ == "__main__":
    main()
