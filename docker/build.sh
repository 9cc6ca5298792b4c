#!/usr/bin/env bash
# Build the project's images on this machine, nothing pulled (`make docker`; needs root, mmdebstrap, docker.io):
#   memrl/debian:bookworm   Debian bookworm minbase (mmdebstrap | docker import): the base of the others
#   memrl/llb-os:bookworm   LifelongAgentBench's OS image (its local-os/default) on that base
#   memrl/mariadb:bookworm  Debian's MariaDB server, run as a non-root user (llb-db's docker backend)
#   memrl/memrl-mcp:local   the memory server's HTTP transport (docker/server/Dockerfile)
# Each image carries a label with the hash of its inputs (its build files, its base image's id, for the server
# the project's sources); an image whose label matches is not rebuilt. Usage: docker/build.sh [IMAGE_KIND...]
# with kinds base, llb-os, mariadb, server (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_BUILDKIT=0 # the classic builder: Debian's engine has no BuildKit frontend without buildx
PYTHON=${PYTHON:-.venv/bin/python}
BASE=memrl/debian:bookworm
LLB_PACKAGES=python3,git,vim,curl,wget,zip,unzip,tree,zsh,passwd,procps # as the bwrap root (Makefile)
LABEL=memrl.inputs

built_hash() { docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }
image_id() { docker image inspect -f '{{.Id}}' "$1"; }
hash_of() { sha256sum | cut -c1-32; }
files_hash() { find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.whl' -print0 | sort -z | xargs -0 sha256sum | hash_of; }

# skip IMAGE HASH: true (and say so) when IMAGE exists with these inputs
skip() {
	if [[ "$(built_hash "$1")" == "$2" ]]; then
		echo "$1: up to date"
		return 0
	fi
	echo "$1: building"
	return 1
}

timed() {
	local start=$SECONDS
	"$@"
	echo "  built in $((SECONDS - start)) s"
}

base() {
	local hash
	hash=$(echo "mmdebstrap --variant=minbase bookworm" | hash_of)
	skip "$BASE" "$hash" && return 0
	timed bash -c "mmdebstrap --quiet --variant=minbase bookworm - | docker import \
		--change 'LABEL $LABEL=$hash' --change 'ENV LANG=C.UTF-8' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD [\"bash\"]' - $BASE >/dev/null"
}

# from_dockerfile NAME DIR [docker build args...]: DIR/Dockerfile on the local base, context DIR
from_dockerfile() {
	local name=$1 dir=$2 hash
	shift 2
	hash=$( (image_id "$BASE" && files_hash "$dir" && echo "$*") | hash_of)
	skip "$name" "$hash" && return 0
	timed docker build --quiet --network host --build-arg "BASE=$BASE" --label "$LABEL=$hash" "$@" -t "$name" "$dir"
}

llb_os() { from_dockerfile memrl/llb-os:bookworm docker/llb-os --build-arg "PACKAGES=${LLB_PACKAGES//,/ }"; }

mariadb() { from_dockerfile memrl/mariadb:bookworm docker/mariadb; }

# The server's Python packages are fetched on the host first (its pip configuration: mirrors, certificates) into
# docker/wheels, and installed in the image from there alone: the build itself needs no package index.
server() {
	local name=memrl/memrl-mcp:local hash
	hash=$( (image_id "$BASE" && files_hash docker/server pyproject.toml README.md memrl_mcp memrl_harness \
		docs/benchmark-data.md) | hash_of)
	skip "$name" "$hash" && return 0
	rm -f docker/wheels/*.whl
	timed "$PYTHON" -m pip wheel --quiet --wheel-dir docker/wheels . "setuptools>=77" wheel
	timed docker build --quiet --network host --build-arg "BASE=$BASE" --build-arg PIP_NO_INDEX=1 \
		--build-arg PIP_FIND_LINKS=/wheels --label "$LABEL=$hash" -f docker/server/Dockerfile -t "$name" .
}

# An engine for the build only, when none answers: stopped again on exit (the tests start their own).
if ! docker info >/dev/null 2>&1; then
	command -v dockerd >/dev/null || {
		echo "dockerd not found: apt-get install docker.io (make docker)" >&2
		exit 1
	}
	log=$(mktemp /tmp/memrl-dockerd.XXXXXX.log)
	dockerd --iptables=false --ip6tables=false --bridge=none >"$log" 2>&1 &
	engine=$!
	trap 'kill $engine; wait $engine || true' EXIT
	for _ in $(seq 60); do
		docker info >/dev/null 2>&1 && break
		kill -0 $engine 2>/dev/null || {
			echo "dockerd exited: $(tail -5 "$log")" >&2
			exit 1
		}
		sleep 0.5
	done
fi
kinds=("$@")
[[ ${#kinds[@]} -gt 0 ]] || kinds=(base llb-os mariadb server)
for kind in "${kinds[@]}"; do
	case $kind in
	base) base ;;
	llb-os) llb_os ;;
	mariadb) mariadb ;;
	server) server ;;
	*)
		echo "unknown image kind: $kind (base, llb-os, mariadb, server)" >&2
		exit 2
		;;
	esac
done
# The images these replaced, and the server's build stage: untagged, and only ever ours (they carry the label).
docker image prune --force --filter "label=$LABEL" >/dev/null
