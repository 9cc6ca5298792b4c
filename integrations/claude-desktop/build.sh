#!/bin/sh
# Builds the Claude Desktop bundle, OUT/memrl-mcp-VERSION.mcpb (OUT: the first argument, default dist/): the files of
# this folder, the server's wheel built from this checkout and a uv.lock of its dependencies, checked and packed by
# the official @anthropic-ai/mcpb (npm ci installs it here, at the version of package-lock.json).
# PYTHON: the Python that builds the wheel (default python3); UV: the uv that writes the lock (default uv).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
absolute() {  # a command as a path that stays right after a cd
    case $1 in */*) echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" ;; *) command -v "$1" ;; esac
}
python=$(absolute "${PYTHON:-python3}")
uv=$(absolute "${UV:-uv}")
command -v npm >/dev/null || { echo "build.sh: npm is missing (make node installs node and npm)" >&2; exit 2; }
version=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$here/manifest.json")

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$here/manifest.json" "$here/pyproject.toml" "$stage/"
mkdir "$stage/server" "$stage/wheels"
cp "$here/server/main.py" "$stage/server/"
"$python" -m pip wheel --no-deps --quiet -w "$stage/wheels" "$root"
[ -f "$stage/wheels/memrl_mcp-$version-py3-none-any.whl" ] || {
    echo "build.sh: the wheel is not memrl_mcp-$version (manifest.json's version): $(ls "$stage/wheels")" >&2; exit 2; }
(cd "$stage" && "$uv" lock --quiet)

[ -x "$here/node_modules/.bin/mcpb" ] || (cd "$here" && npm ci --no-audit --no-fund --silent)
cd "$stage"  # mcpb lists the bundle's files relative to here
"$here/node_modules/.bin/mcpb" validate manifest.json
"$here/node_modules/.bin/mcpb" pack . "$out/memrl-mcp-$version.mcpb"
