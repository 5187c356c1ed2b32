#!/usr/bin/env bash
# build-image.sh [KVROUTE_BINARY]
#
# Builds the kvroute container image without a container daemon, from Debian's package
# archive, and checks it. `make image` builds the binary first and runs this.
#
#   1. deploy/container/make-rootfs.sh: debootstrap --variant=minbase bookworm, the
#      packages of deploy/container/runtime-packages.txt, and a root filesystem with only
#      those packages' files, the user 65532 and KVROUTE_BINARY (default build/kvroute)
#      as /usr/local/bin/kvroute. The Dockerfile's rootfs stage runs the same script.
#   2. umoci packs it as one layer of an OCI image tagged VERSION (CMakeLists.txt's
#      project version), with the user, entrypoint, command, exposed ports and labels of
#      deploy/container/Dockerfile's runtime stage, read from that file.
#   3. skopeo writes the image as build/image/kvroute-VERSION.oci.tar (OCI archive, image
#      name kvroute:VERSION) and build/image/kvroute-VERSION.docker.tar (the same image as
#      a docker-archive, for `kind load image-archive`, `docker load`, `podman load`).
#   4. The archive's file listing (deploy/container/list-files.py) must equal
#      deploy/container/rootfs-files.txt, the listing a Docker build of the Dockerfile
#      must also give. KVROUTE_IMAGE_LISTING=update rewrites that file instead.
#   5. deploy/container/check-image.sh runs the archive's root filesystem under chroot.
#
# Installs debootstrap, umoci and skopeo with apt when they are missing. Runs as root
# (debootstrap, chroot, mount), or through sudo. Environment: MIRROR, SECURITY_MIRROR
# (make-rootfs.sh), IMAGE_DIR (default build/image).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
binary="$(realpath -m "${1:-build/kvroute}")"
IMAGE_DIR="$(realpath -m "${IMAGE_DIR:-build/image}")"
NAME=build-image
started=$(date +%s)

if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=MIRROR,SECURITY_MIRROR,KVROUTE_IMAGE_LISTING \
    IMAGE_DIR="$IMAGE_DIR" bash "$repo/scripts/build-image.sh" "$binary"
fi
if [ ! -x "$binary" ]; then
  echo "$NAME: $binary not found: build it first (make build-kvroute), or run make image" >&2
  exit 1
fi

tools=()
command -v debootstrap >/dev/null || tools+=(debootstrap)
command -v umoci >/dev/null || tools+=(umoci)
command -v skopeo >/dev/null || tools+=(skopeo)
command -v python3 >/dev/null || tools+=(python3)
command -v curl >/dev/null || tools+=(curl)
if [ ${#tools[@]} -gt 0 ]; then
  echo "$NAME: installing ${tools[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${tools[@]}"
fi

version=$(sed -n -E 's/^project\(kvroute VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "$NAME: no project(kvroute VERSION x.y.z) in CMakeLists.txt" >&2; exit 1; }
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Every file's mtime and the image's creation time: the commit's, so that a rebuild of
# the same commit from the same packages gives the same layer.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
image="kvroute:$version"
work="$IMAGE_DIR/work"
layout="$work/oci"
oci_tar="$IMAGE_DIR/kvroute-$version.oci.tar"
docker_tar="$IMAGE_DIR/kvroute-$version.docker.tar"
mkdir -p "$IMAGE_DIR"

# 1. The root filesystem.
SOURCE_DATE_EPOCH=$epoch bash deploy/container/make-rootfs.sh "$work" "$binary" \
  deploy/container/runtime-packages.txt
t_rootfs=$(date +%s)

# 2. The image's configuration, from the Dockerfile's runtime stage.
dockerfile=deploy/container/Dockerfile
stage=$(awk '/^FROM scratch AS runtime/ { on = 1; next } /^FROM / { on = 0 } on' "$dockerfile")
[ -n "$stage" ] || { echo "$NAME: no 'FROM scratch AS runtime' stage in $dockerfile" >&2; exit 1; }
subst() { sed -e "s/\${VERSION}/$version/g" -e "s/\${REVISION}/$revision/g"; }
config=(--os linux --architecture amd64 --created "$created" --author kvroute
        --history.created "$created" --history.created_by "deploy/container/make-rootfs.sh")
while IFS= read -r line; do
  case "$line" in
    LABEL\ *)
      kv=$(sed -E 's/^LABEL ([^=]+)="(.*)"$/\1=\2/' <<<"$line" | subst)
      config+=(--config.label "$kv") ;;
    ENV\ *)
      kv=$(sed -E 's/^ENV ([^=]+)="(.*)"$/\1=\2/' <<<"$line" | subst)
      config+=(--config.env "$kv") ;;
    USER\ *) config+=(--config.user "${line#USER }") ;;
    EXPOSE\ *) for p in ${line#EXPOSE }; do config+=(--config.exposedports "$p"); done ;;
    ENTRYPOINT\ *)
      while IFS= read -r a; do config+=(--config.entrypoint "$a"); done < <(
        python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "${line#ENTRYPOINT }") ;;
    CMD\ *)
      while IFS= read -r a; do config+=(--config.cmd "$a"); done < <(
        python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "${line#CMD }") ;;
    ""|\#*|COPY\ *|ARG\ *) ;;
    *) echo "$NAME: $dockerfile: runtime stage: '$line' is not read by this script" >&2; exit 1 ;;
  esac
done <<<"$stage"

# 3. Pack: one layer, then the two archives.
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci insert --image "$layout:$version" --history.created "$created" \
  --history.created_by "deploy/container/make-rootfs.sh" "$work/rootfs" /
umoci config --image "$layout:$version" "${config[@]}"
umoci gc --layout "$layout"
rm -f "$oci_tar" "$docker_tar"
skopeo --insecure-policy copy -q "oci:$layout:$version" "oci-archive:$oci_tar:$image"
skopeo --insecure-policy copy -q "oci:$layout:$version" "docker-archive:$docker_tar:$image"
t_pack=$(date +%s)

# 4. The file listing, from the archive.
listing="$IMAGE_DIR/rootfs-files.txt"
python3 deploy/container/list-files.py "$oci_tar" >"$listing"
python3 deploy/container/list-files.py "$work/rootfs" | diff -u - "$listing" >/dev/null || {
  echo "$NAME: the archive does not hold the files of $work/rootfs" >&2
  python3 deploy/container/list-files.py "$work/rootfs" | diff -u - "$listing" | head -40 >&2
  exit 1
}
if [ "${KVROUTE_IMAGE_LISTING:-}" = update ]; then
  cp "$listing" deploy/container/rootfs-files.txt
  echo "$NAME: deploy/container/rootfs-files.txt rewritten"
elif ! diff -u deploy/container/rootfs-files.txt "$listing" >"$IMAGE_DIR/rootfs-files.diff"; then
  echo "$NAME: the image's files differ from deploy/container/rootfs-files.txt:" >&2
  head -60 "$IMAGE_DIR/rootfs-files.diff" >&2
  echo "$NAME: (a new package or library?) check the change, then run" \
    "KVROUTE_IMAGE_LISTING=update $0 to record it" >&2
  exit 1
fi
echo "$NAME: files: $(wc -l <"$listing") entries, as deploy/container/rootfs-files.txt lists"

# 5. Run it.
bash deploy/container/check-image.sh "$oci_tar"
done_at=$(date +%s)

rootfs_size=$(du -s --apparent-size --block-size=1 "$work/rootfs" | cut -f1)
binary_size=$(stat -c %s "$work/rootfs/usr/local/bin/kvroute")
layer_size=$(python3 -c '
import json, sys
d = sys.argv[1]
idx = json.load(open(d + "/index.json"))
m = idx["manifests"][0]["digest"].split(":")
man = json.load(open(f"{d}/blobs/{m[0]}/{m[1]}"))
print(sum(l["size"] for l in man["layers"]))' "$layout")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "$NAME: $image"
echo "  $oci_tar  $(mib "$(stat -c %s "$oci_tar")") (layer gzip $(mib "$layer_size"))"
echo "  $docker_tar  $(mib "$(stat -c %s "$docker_tar")")"
echo "  unpacked root filesystem $(mib "$rootfs_size"), of which /usr/local/bin/kvroute $(mib "$binary_size")"
echo "  time: root filesystem $((t_rootfs - started)) s, pack $((t_pack - t_rootfs)) s," \
  "listing and check $((done_at - t_pack)) s, total $((done_at - started)) s"
