#!/usr/bin/env bash
# Build llama.cpp (the peer that benchmarks/runtime.py --llama-cpp compares against) outside
# the repository. The source is the vendor/llama.cpp of the llama-cpp-python sdist from PyPI
# (PyPI is the only reachable source here); it is never vendored into this repository.
#
# Needs: Debian packages cmake, g++ (apt-get install cmake g++), and the Python given in $PY
# (default python3) with pip. Takes ~8+ minutes on 2 cores; run it with nice.
#
# usage: scripts/build-llama-cpp.sh [DEST]      (default DEST: ./llama-build)
# result: DEST/llama.cpp/build/bin/{llama-bench,llama-quantize,llama-server} and
#         DEST/llama.cpp/convert_hf_to_gguf.py -> pass DEST/llama.cpp to `benchmarks/runtime.py
#         --llama-cpp` and `benchmarks/serve.py --llama-cpp`. llama-server is built without its web
#         UI (LLAMA_BUILD_UI=OFF, and LLAMA_USE_PREBUILT_UI=OFF: no download from Hugging Face);
#         its HTTP API is what the serve benchmark uses. A DEST built before llama-server was added
#         is reconfigured and gets it (the other targets stay built).
# On a host with AMX (Sapphire Rapids and later Xeons) llama-bench of this build crashes with its
# repacked weights (q8_0: SIGSEGV, q4_0: SIGILL, seen 2026-12-01): benchmark with
# `--llama-bench-args "--repack 0"` (docs/runtime.md, "Against llama.cpp"); benchmarks/serve.py passes
# llama-server `--no-repack` there.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"   # vendors llama.cpp 0c1e570 (the sdist's vendor/llama.cpp)
DEST="${1:-llama-build}"
PY="${PY:-python3}"
JOBS="${JOBS:-2}"

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null || { echo "error: '$tool' not found (apt-get install cmake g++ tar)" >&2; exit 1; }
done
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
sdist="$DEST/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
    echo "== downloading llama-cpp-python==$VERSION sdist"
    "$PY" -m pip download --no-deps --no-binary :all: -d "$DEST" "llama-cpp-python==$VERSION"
fi
src="$DEST/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
    echo "== unpacking vendor/llama.cpp"
    tmp="$DEST/unpack"
    rm -rf "$tmp" && mkdir -p "$tmp"
    tar -xzf "$sdist" -C "$tmp"
    rm -rf "$src"
    mv "$tmp"/llama_cpp_python-"$VERSION"/vendor/llama.cpp "$src"
    rm -rf "$tmp"
fi
echo "== configuring (Release, GGML_NATIVE=ON, LLAMA_CURL=OFF, server without web UI)"
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
echo "== building llama-bench llama-quantize llama-server with -j$JOBS"
cmake --build "$src/build" -j"$JOBS" --target llama-bench llama-quantize llama-server
ls -l "$src/build/bin/llama-bench" "$src/build/bin/llama-quantize" "$src/build/bin/llama-server"
echo "== done: use --llama-cpp $src"
