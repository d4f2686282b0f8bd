#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine: the wasm32-wasip2 Rust target (to
# build the plugins), ffmpeg and a General MIDI SoundFont (video-to-music), componentize-py
# (the Python example plugin), chromium with chromedriver and a ComfyUI client from PyPI
# (the ComfyUI protocol tests). Safe to run again: it skips what is there.
set -euo pipefail

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

missing=()
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
[ -f /usr/share/sounds/sf2/TimGM6mb.sf2 ] || missing+=(timgm6mb-soundfont)
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# Headless chromium and its WebDriver, for the ComfyUI editor test.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ "${1:-}" = "--with-python" ] && ! command -v componentize-py >/dev/null 2>&1; then
  python3 -m pip install --quiet componentize-py==0.17.2
fi

# comfy-api-simplified, the PyPI ComfyUI client the protocol tests run (in target/).
"$(dirname "$0")/comfy-client.sh" >/dev/null
