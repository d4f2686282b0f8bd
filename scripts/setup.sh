#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine: the wasm32-wasip2 Rust target (to
# build the plugins), ffmpeg and a General MIDI SoundFont (video-to-music), and
# componentize-py (the Python example plugin, with --with-python) and cargo-fuzz (the fuzz
# targets in fuzz/, with --with-fuzz). Safe to run again: it skips what is there.
set -euo pipefail

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

missing=()
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
[ -f /usr/share/sounds/sf2/TimGM6mb.sf2 ] || missing+=(timgm6mb-soundfont)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

with_python=false
with_fuzz=false
for arg in "$@"; do
  case "$arg" in
    --with-python) with_python=true ;;
    --with-fuzz) with_fuzz=true ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

if $with_python && ! command -v componentize-py >/dev/null 2>&1; then
  python3 -m pip install --quiet componentize-py==0.17.2
fi

# cargo-fuzz drives libFuzzer; on stable rustc it runs with RUSTC_BOOTSTRAP=1 (scripts/fuzz.sh).
if $with_fuzz && ! cargo fuzz --version 2>/dev/null | grep -q "0\.13\.1"; then
  cargo install --locked cargo-fuzz --version 0.13.1
fi
