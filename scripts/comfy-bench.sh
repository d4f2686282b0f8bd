#!/usr/bin/env bash
# ComfyUI-protocol throughput of a fresh `weft serve`, for one 3-node image graph
# (EmptyImage -> ImageInvert -> SaveImage, 64x64, a new colour each time so nothing is
# served from the node cache):
#   - prompts/s through POST /prompt, with /history/{id} polled until each is done;
#   - end-to-end latency through the WebSocket (POST /prompt to `executing` null on /ws).
#
#   scripts/comfy-bench.sh [path/to/weft] [prompts]    (default: target/release/weft, 200)
set -euo pipefail
cd "$(dirname "$0")/.."
weft=${1:-target/release/weft}
count=${2:-200}
python=$(./scripts/comfy-client.sh)
data=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$weft" serve --addr "127.0.0.1:$port" --data-dir "$data" >"$data/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/healthz" | grep -q '"ready":true' && break
  sleep 0.1
done
"$python" - "http://127.0.0.1:$port" "$count" <<'PY'
import asyncio, json, sys, time
import requests, websockets

base, count = sys.argv[1], int(sys.argv[2])

def graph(color):
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bench"}},
    }

session = requests.Session()
start = time.perf_counter()
ids = [session.post(f"{base}/prompt", json={"prompt": graph(i)}).json()["prompt_id"] for i in range(count)]
for pid in ids:
    while pid not in session.get(f"{base}/history/{pid}").json():
        time.sleep(0.002)
elapsed = time.perf_counter() - start
print(f"POST /prompt + /history polling: {count} prompts in {elapsed:.2f} s = {count / elapsed:.1f} prompts/s")

async def over_ws(n):
    latencies = []
    async with websockets.connect(base.replace("http", "ws", 1) + "/ws?clientId=bench") as ws:
        await ws.recv()
        for i in range(n):
            t0 = time.perf_counter()
            pid = session.post(f"{base}/prompt", json={"prompt": graph(100000 + i), "client_id": "bench"}).json()["prompt_id"]
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    m = json.loads(message)
                    if m["type"] == "executing" and m["data"]["node"] is None and m["data"]["prompt_id"] == pid:
                        break
            latencies.append(time.perf_counter() - t0)
    latencies.sort()
    return latencies

lat = asyncio.run(over_ws(min(count, 100)))
print(f"end to end over /ws, one prompt at a time: median {lat[len(lat) // 2] * 1000:.1f} ms, "
      f"p90 {lat[int(len(lat) * 0.9)] * 1000:.1f} ms, {len(lat) / sum(lat):.1f} prompts/s")
PY
