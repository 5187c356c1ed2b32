#!/usr/bin/env bash
# make-rootfs.sh WORK KVROUTE_BINARY [PACKAGES_FILE]
#
# Builds the image's root filesystem in WORK/rootfs, the same way for both ways of
# building the image: scripts/build-image.sh (offline, on a Debian 12 host) and the
# Dockerfile's `rootfs` stage (inside a debian:12 container). Steps:
#
#   1. debootstrap --variant=minbase bookworm into WORK/full, then apt-get in a chroot:
#      bookworm, bookworm-updates and bookworm-security, upgrade, and the packages of
#      PACKAGES_FILE (default: runtime-packages.txt next to this script).
#   2. The packages of PACKAGES_FILE and everything they depend on (Pre-Depends and
#      Depends, followed to the end; an alternative resolves to the one installed)
#      except the tools that only run their install scripts (INSTALL_ONLY below).
#   3. WORK/rootfs gets exactly those packages' files, the CA bundle update-ca-certificates
#      made, OpenSSL's directory and configuration (from the openssl package, without
#      its command), a fresh ld.so.cache, a dpkg status file naming the packages (for image
#      scanners), /etc/passwd and /etc/group with root and the user kvroute (65532), and
#      KVROUTE_BINARY as /usr/local/bin/kvroute. No shell, no package manager, no
#      documentation. Every mtime is set to SOURCE_DATE_EPOCH (default: 0).
#
# Environment: MIRROR (default http://deb.debian.org/debian), SECURITY_MIRROR
# (http://deb.debian.org/debian-security), CACHE (a directory kept between runs for the
# downloaded .debs; default WORK/cache). Runs as root (debootstrap, chroot).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 WORK KVROUTE_BINARY [PACKAGES_FILE]" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(realpath -m "$1")"
binary="$(realpath "$2")"
pkgfile="$(realpath "${3:-$here/runtime-packages.txt}")"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
CACHE="$(realpath -m "${CACHE:-$work/cache}")"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-0}"
SUITE=bookworm
# Needed by install scripts only (ca-certificates': openssl rehash, debconf questions;
# base-files': awk), not by kvroute: left out of the image.
INSTALL_ONLY="debconf perl-base openssl mawk"

if [ "$(id -u)" -ne 0 ]; then
  echo "make-rootfs: must run as root (debootstrap and chroot)" >&2
  exit 1
fi
[ -x "$binary" ] || { echo "make-rootfs: $binary is not an executable" >&2; exit 1; }
packages=$(sed -e 's/#.*//' "$pkgfile" | xargs)
[ -n "$packages" ] || { echo "make-rootfs: no packages in $pkgfile" >&2; exit 1; }

full="$work/full"
root="$work/rootfs"
mkdir -p "$work" "$CACHE/debootstrap" "$CACHE/apt"

mounted=""
cleanup() {
  if [ -n "$mounted" ]; then umount "$full/proc" 2>/dev/null || true; fi
}
trap cleanup EXIT

step() { echo "make-rootfs: $*"; }

# 1. A minimal Debian 12 and the runtime packages, from the archive. A run that was
# killed may have left /proc mounted in the old tree.
if mountpoint -q "$full/proc" 2>/dev/null; then umount "$full/proc" || umount -l "$full/proc"; fi
rm -rf --one-file-system "$full" "$root"
step "debootstrap --variant=minbase $SUITE $MIRROR"
debootstrap --variant=minbase --cache-dir="$CACHE/debootstrap" "$SUITE" "$full" "$MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
cat >"$full/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
printf '#!/bin/sh\nexit 101\n' >"$full/usr/sbin/policy-rc.d"
chmod +x "$full/usr/sbin/policy-rc.d"
# /proc for the install scripts; a container build may not mount it, and apt does without.
if mount -t proc proc "$full/proc" 2>/dev/null; then mounted=1; fi
cp -a "$CACHE/apt/." "$full/var/cache/apt/archives/" 2>/dev/null || true
in_full() { chroot "$full" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
step "apt-get install $packages"
{
  in_full apt-get update -q &&
    in_full apt-get upgrade -y -q &&
    in_full apt-get install -y -q --no-install-recommends $packages
} >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
cp -a "$full/var/cache/apt/archives/"*.deb "$CACHE/apt/" 2>/dev/null || true

# 2. The dependency closure of the runtime packages.
installed() {
  [ "$(in_full dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}
declare -A keep=()
queue=($packages)
while [ ${#queue[@]} -gt 0 ]; do
  p="${queue[0]}"
  queue=("${queue[@]:1}")
  [ -n "${keep[$p]:-}" ] && continue
  case " $INSTALL_ONLY " in *" $p "*) continue ;; esac
  installed "$p" || { echo "make-rootfs: package $p is not installed" >&2; exit 1; }
  keep[$p]=1
  deps=$(in_full dpkg-query -W -f='${Pre-Depends}, ${Depends}' "$p")
  IFS=',' read -ra groups <<<"$deps"
  for g in "${groups[@]}"; do
    chosen=""
    IFS='|' read -ra alts <<<"$g"
    for a in "${alts[@]}"; do
      name=$(echo "$a" | sed -e 's/(.*)//' -e 's/:any//' | xargs)
      [ -n "$name" ] || continue
      if installed "$name"; then chosen="$name"; break; fi
    done
    if [ -z "$chosen" ]; then
      # Only virtual packages are left: the installed package that provides one.
      for a in "${alts[@]}"; do
        name=$(echo "$a" | sed -e 's/(.*)//' -e 's/:any//' | xargs)
        [ -n "$name" ] || continue
        chosen=$(in_full dpkg-query -W -f='${Package} ${Provides} ${db:Status-Status}\n' |
          awk -v v="$name" '$NF == "installed" { for (i = 2; i < NF; i++) { f = $i; sub(/,$/, "", f); if (f == v) { print $1; exit } } }')
        [ -n "$chosen" ] && break
      done
    fi
    if [ -z "$chosen" ] && [ -n "$(echo "$g" | xargs)" ]; then
      echo "make-rootfs: $p depends on '$g', which nothing installed provides" >&2
      exit 1
    fi
    [ -n "$chosen" ] && queue+=("$chosen")
  done
done
kept=$(printf '%s\n' "${!keep[@]}" | sort)
step "keeping $(echo "$kept" | wc -l) packages: $(echo $kept)"

# 3. The image's root filesystem: those packages' files and nothing else.
mkdir -p "$root"
# Debian 12 has merged /usr: /bin, /lib, ... are symlinks into /usr, made by debootstrap
# and owned by no package. dpkg still lists some files under the old names.
for l in bin sbin lib lib32 lib64 libx32; do
  if [ -L "$full/$l" ]; then cp -a "$full/$l" "$root/$l"; fi
done
list="$work/files.list"
for p in $kept; do in_full dpkg-query -L "$p"; done |
  sed -E -e 's#^/(bin|sbin|lib|lib32|lib64|libx32)(/|$)#/usr/\1\2#' |
  grep -v -E '^/usr/share/(man|info|lintian|locale|bug|gdb|gcc)(/|$)' |
  grep -v -E '^/usr/share/doc/[^/]+/.' | grep -v -x '/\.' |
  sed -e 's#^/##' | sort -u >"$list"
# Documentation goes, but each package's copyright file stays: the image redistributes them.
# (A package whose doc directory is a symlink to another's has that one's.)
for p in $kept; do
  if [ ! -L "$full/usr/share/doc/$p" ] && [ -f "$full/usr/share/doc/$p/copyright" ]; then echo "usr/share/doc/$p/copyright"; fi
done >>"$list"
sort -u -o "$list" "$list"
# The directories themselves, so each keeps its mode; only paths that exist (dpkg lists
# diversions and conffiles a package removed).
(cd "$full" && while IFS= read -r f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\n' "$f"; fi
done <"$list") >"$list.present"
tar -C "$full" --no-recursion -cf - -T "$list.present" | tar -C "$root" -xpf -
# Made by update-ca-certificates, owned by no package.
if [ -d "$full/etc/ssl/certs" ] && [ -n "${keep[ca-certificates]:-}" ]; then
  mkdir -p "$root/etc/ssl"
  cp -a "$full/etc/ssl/certs" "$root/etc/ssl/"
fi
# OpenSSL's directory (OPENSSLDIR, /usr/lib/ssl), where libssl's default verify paths
# look for the CA bundle (cert.pem, certs -> /etc/ssl/certs), and its configuration
# (openssl.cnf -> /etc/ssl/openssl.cnf). They belong to the openssl package, whose
# command the image does not need: only these files are taken from it.
if [ -n "${keep[libssl3]:-}" ]; then
  tar -C "$full" --exclude=usr/lib/ssl/misc -cf - usr/lib/ssl etc/ssl/openssl.cnf etc/ssl/private |
    tar -C "$root" -xpf -
fi
# The user: root and kvroute (65532, as distroless's nonroot), no shell, no home: kvroute
# writes nothing but under $TMPDIR, and every file in the image belongs to root.
mkdir -p "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
kvroute:x:65532:65532:kvroute:/nonexistent:/usr/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
kvroute:x:65532:
EOF
chmod 0644 "$root/etc/passwd" "$root/etc/group"
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
hosts:  files dns
EOF
# The packages' status stanzas, so a scanner can see what the image holds.
mkdir -p "$root/var/lib/dpkg"
for p in $kept; do in_full dpkg-query -s "$p"; echo; done >"$root/var/lib/dpkg/status"
# The binary, and a loader cache for exactly these libraries (ldconfig is static).
install -D -m 0755 "$binary" "$root/usr/local/bin/kvroute"
cp -a "$full/etc/ld.so.conf" "$root/etc/" 2>/dev/null || true
if [ -d "$full/etc/ld.so.conf.d" ]; then cp -a "$full/etc/ld.so.conf.d" "$root/etc/"; fi
"$full/usr/sbin/ldconfig" -r "$root"
rm -rf "$root/var/cache/ldconfig"
# Every file belongs to root (base-files gives /var/local to group staff, which the image
# has no use for), so whether a copy keeps owners cannot change the image.
chown -R -h 0:0 "$root"
find "$root" -depth -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
step "$root: $(du -sh --apparent-size "$root" | cut -f1) ($(find "$root" -not -type d | wc -l) files)"
