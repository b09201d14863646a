#!/usr/bin/env bash
# llama.cpp's llama-server, built from the llama.cpp sources vendored in the sdist of the
# llama-cpp-python version respd runs, so both serve with the same code. Built once into a
# cache directory and reused; prints the binary's path.
#
#   export RESPD_TEST_LLAMA_SERVER="$(scripts/llama-server.sh)"
#
# Needs cmake and a C++ compiler (installed from Debian packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
version=$("$python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
cache=${RESPD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/respd}/llama-server-$version
binary=$cache/build/bin/llama-server
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi
if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null; then
    echo "llama-server.sh: installing cmake and a C++ compiler from Debian packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq cmake g++ >&2
fi
mkdir -p "$cache"
echo "llama-server.sh: building llama-server $version into $cache" >&2
"$python" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" \
    -d "$cache" >&2
tar xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
cmake -S "$cache/llama_cpp_python-$version/vendor/llama.cpp" -B "$cache/build" \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$cache/build" --target llama-server -j"$(nproc)" >&2
rm -rf "$cache/llama_cpp_python-$version" "$cache/llama_cpp_python-$version.tar.gz"
echo "$binary"
