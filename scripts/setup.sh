#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine: the wasm32-wasip2 Rust target (to
# build the plugins), ffmpeg and a General MIDI SoundFont (video-to-music), PostgreSQL's
# server binaries (the tests start throw-away clusters; no server is left running),
# componentize-py (the Python example plugin), Chromium with its WebDriver (the browser
# tests), and with --with-js Node.js, npm and the pinned componentize-js/jco of
# scripts/js-toolchain (the JavaScript example plugin), installed into target/js-toolchain.
# Safe to run again: it skips what is there.
set -euo pipefail

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

missing=()
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
if [[ " $* " == *" --with-js "* ]]; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
[ -f /usr/share/sounds/sf2/TimGM6mb.sf2 ] || missing+=(timgm6mb-soundfont)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  # The package starts a cluster of its own; the tests never use it.
  if [[ " ${missing[*]} " == *" postgresql "* ]] && command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version name _; do
      $SUDO pg_ctlcluster "$version" "$name" stop 2>/dev/null || true
    done
  fi
fi

if [[ " $* " == *" --with-python "* ]] && ! command -v componentize-py >/dev/null 2>&1; then
  python3 -m pip install --quiet componentize-py==0.17.2
fi

if [[ " $* " == *" --with-js "* ]]; then
  "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/js-toolchain/install.sh"
fi
