#!/usr/bin/env bash
# check-image.sh IMAGE.oci.tar
#
# Runs the image without a container runtime: unpacks the OCI archive's root filesystem
# (umoci, from the archive itself, not from the directory it was built from) and runs its
# /usr/local/bin/kvroute under chroot as the image's user (65532:65532), as a container
# would: with /proc and /dev mounted and /etc/hosts written by the runtime.
#   1. `kvroute --help` exits 0 and lists the commands.
#   2. `kvroute sim` (one replica) and `kvroute serve` in front of it, both inside the
#      root filesystem on loopback ports; one POST /v1/completions from outside the
#      chroot (curl) through serve answers 200 with a completion.
# Everything is stopped, unmounted and removed on exit, also on failure. Root only.
# Environment: SIM_PORT (default 18400), SERVE_PORT (18480).
set -euo pipefail

if [ $# -ne 1 ]; then echo "usage: $0 IMAGE.oci.tar" >&2; exit 2; fi
archive="$(realpath "$1")"
SIM_PORT="${SIM_PORT:-18400}"
SERVE_PORT="${SERVE_PORT:-18480}"
USERSPEC=65532:65532
NAME=check-image

if [ "$(id -u)" -ne 0 ]; then echo "$NAME: must run as root (chroot, mount)" >&2; exit 1; fi
for p in "$SIM_PORT" "$SERVE_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "$NAME: port $p is in use (set SIM_PORT / SERVE_PORT)" >&2
    exit 2
  fi
done

tmp=$(mktemp -d /tmp/kvroute-check-image.XXXXXX)
root="$tmp/bundle/rootfs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # Anything else still running inside the image (a child the kill missed).
  for d in /proc/[0-9]*; do
    if [ "$(readlink "$d/root" 2>/dev/null)" = "$root" ]; then kill -9 "${d#/proc/}" 2>/dev/null || true; fi
  done
  for m in "$root/dev" "$root/proc"; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" || umount -l "$m" || true; fi
  done
  if mountpoint -q "$root/proc" 2>/dev/null || mountpoint -q "$root/dev" 2>/dev/null; then
    echo "$NAME: $tmp is still mounted; not removed" >&2
  else
    rm -rf --one-file-system "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "$NAME: FAIL: $*" >&2; exit 1; }

# The archive's image, unpacked by umoci as a runtime would.
mkdir -p "$tmp/layout"
tar -C "$tmp/layout" -xf "$archive"
tag=$(umoci ls --layout "$tmp/layout" | head -1)
[ -n "$tag" ] || fail "no image in $archive"
umoci unpack --image "$tmp/layout:$tag" "$tmp/bundle" >/dev/null
user=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["process"]["user"]["uid"])' "$tmp/bundle/config.json")
[ "$user" = 65532 ] || fail "the image's user is $user, not 65532"
# libssl's default verify paths (set_default_verify_paths: HTTPS upstreams, the
# Kubernetes API server) lead to the CA bundle, following links as the image sees them.
python3 - "$root" <<'EOF' || fail "libssl's default CA paths do not lead to the CA bundle in the image"
import os, sys
root = sys.argv[1]
def resolve(path, depth=0):
    assert depth < 20, path
    parts, cur = path.strip("/").split("/"), ""
    for i, p in enumerate(parts):
        cur = cur + "/" + p
        if os.path.islink(root + cur):
            t = os.readlink(root + cur)
            base = t if t.startswith("/") else os.path.join(os.path.dirname(cur), t)
            rest = "/".join(parts[i + 1:])
            return resolve(os.path.normpath(base) + ("/" + rest if rest else ""), depth + 1)
    return root + cur
for path in ("/usr/lib/ssl/cert.pem", "/usr/lib/ssl/certs/ca-certificates.crt"):
    f = resolve(path)
    assert os.path.isfile(f), path
    assert open(f).read().count("BEGIN CERTIFICATE") > 100, path
EOF
echo "$NAME: /usr/lib/ssl/cert.pem and /usr/lib/ssl/certs lead to the CA bundle: ok"

# What a container runtime provides.
mkdir -p "$root/proc" "$root/dev"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$root/etc/hosts"
in_image() { chroot --userspec="$USERSPEC" "$root" "$@"; }

# 1. --help.
help=$(in_image /usr/local/bin/kvroute --help) || fail "kvroute --help exited $?"
for cmd in serve epp sim; do
  grep -qw "$cmd" <<<"$help" || fail "kvroute --help does not list $cmd"
done
echo "$NAME: kvroute --help as $USERSPEC: ok"

# 2. sim + serve inside, one request from outside.
cat >"$root/tmp/serve.yaml" <<EOF
listen: 127.0.0.1:$SERVE_PORT
pool:
  endpoints:
    - 127.0.0.1:$SIM_PORT
EOF
chmod 0644 "$root/tmp/serve.yaml"
# chroot itself in the background (it execs kvroute), so that $! is kvroute's pid.
chroot --userspec="$USERSPEC" "$root" /usr/local/bin/kvroute sim --replicas 1 \
  --port "$SIM_PORT" --host 127.0.0.1 --time-scale 0 >"$tmp/sim.log" 2>&1 &
pids+=($!)
chroot --userspec="$USERSPEC" "$root" /usr/local/bin/kvroute serve --config /tmp/serve.yaml \
  >"$tmp/serve.log" 2>&1 &
pids+=($!)
ready=""
for _ in $(seq 100); do
  if curl -sf "http://127.0.0.1:$SERVE_PORT/readyz" >/dev/null; then ready=1; break; fi
  sleep 0.1
done
if [ -z "$ready" ]; then
  cat "$tmp/sim.log" "$tmp/serve.log" >&2
  fail "serve not ready on 127.0.0.1:$SERVE_PORT within 10 s"
fi
code=$(curl -s -o "$tmp/body.json" -w '%{http_code}' "http://127.0.0.1:$SERVE_PORT/v1/completions" \
  -H 'content-type: application/json' \
  -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Hello from outside the image","max_tokens":8}')
body=$(cat "$tmp/body.json")
[ "$code" = 200 ] || { cat "$tmp/serve.log" >&2; fail "POST /v1/completions answered $code: $body"; }
python3 - "$tmp/body.json" <<'EOF' || fail "not a completion: $body"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["object"] == "text_completion", b
assert isinstance(b["choices"][0]["text"], str) and b["choices"][0]["text"], b
assert b["usage"]["completion_tokens"] == 8, b
EOF
echo "$NAME: kvroute sim + kvroute serve in the image as $USERSPEC, POST /v1/completions from outside: 200, $(python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(b["usage"]["completion_tokens"], "tokens:", repr(b["choices"][0]["text"]))' "$tmp/body.json")"
echo "$NAME: ok"
