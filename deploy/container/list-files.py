#!/usr/bin/env python3
"""Print an image's file listing, one entry a line, sorted by path:

    <type> <mode> <uid>:<gid> /<path>[ -> <link target>]

type is d (directory), f (regular file, hard links included), l (symbolic link) or c/b/p
(device, fifo). Sizes and times are left out: they change with every security update of
a package, the set of files does not.

The source is one of:
  a directory                    the root filesystem itself (scripts/build-image.sh's)
  an OCI image archive (.tar)    an oci-archive holding one image: its layers, in order
  any other tar, or - for stdin  a flattened filesystem, e.g. `docker export CONTAINER`

Entries a container runtime adds to every container (/.dockerenv, /etc/hosts,
/etc/hostname, /etc/resolv.conf, /dev, /proc, /sys and what is below them, as
`docker export` shows them) are left out, so a Docker build and the offline archive list
the same. Only the Python standard library is used.
"""
import io
import json
import os
import stat
import sys
import tarfile

RUNTIME_ADDED = {"/.dockerenv", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/mtab"}
RUNTIME_TREES = ("/dev", "/proc", "/sys")


def skipped(path):
    if path == "/" or path in RUNTIME_ADDED:
        return True
    return any(path == t or path.startswith(t + "/") for t in RUNTIME_TREES)


def norm(name):
    if name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    return "/" + name if name and name != "." else "/"


def from_dir(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            full = os.path.join(dirpath, n)
            st = os.lstat(full)
            path = "/" + os.path.relpath(full, root)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[path] = ("l", 0o777, st.st_uid, st.st_gid, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[path] = ("d", mode, st.st_uid, st.st_gid, None)
            elif stat.S_ISREG(st.st_mode):
                out[path] = ("f", mode, st.st_uid, st.st_gid, None)
            else:
                kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else "p"
                out[path] = (kind, mode, st.st_uid, st.st_gid, None)
    return out


def apply_layer(out, tar):
    for m in tar.getmembers():
        path = norm(m.name)
        base = os.path.basename(path)
        parent = os.path.dirname(path)
        if base == ".wh..wh..opq":
            for p in [p for p in out if p.startswith(parent.rstrip("/") + "/")]:
                del out[p]
            continue
        if base.startswith(".wh."):
            gone = os.path.join(parent, base[4:])
            for p in [p for p in out if p == gone or p.startswith(gone + "/")]:
                del out[p]
            continue
        if m.issym():
            out[path] = ("l", 0o777, m.uid, m.gid, m.linkname)
        elif m.isdir():
            out[path] = ("d", m.mode & 0o7777, m.uid, m.gid, None)
        elif m.isfile() or m.islnk():
            out[path] = ("f", m.mode & 0o7777, m.uid, m.gid, None)
        else:
            kind = "c" if m.ischr() else "b" if m.isblk() else "p"
            out[path] = (kind, m.mode & 0o7777, m.uid, m.gid, None)


def from_tar(f):
    with tarfile.open(fileobj=f, mode="r:*") as outer:
        names = set(outer.getnames())
        if "index.json" not in names and "./index.json" not in names:
            out = {}
            apply_layer(out, outer)
            return out
        # An OCI image archive: index -> manifest -> layers.
        def blob(digest):
            alg, hexd = digest.split(":", 1)
            for prefix in ("", "./"):
                try:
                    return outer.extractfile(f"{prefix}blobs/{alg}/{hexd}").read()
                except KeyError:
                    pass
            raise SystemExit(f"list-files: blob {digest} missing from the archive")

        index = json.loads(outer.extractfile(
            "index.json" if "index.json" in names else "./index.json").read())
        if len(index["manifests"]) != 1:
            raise SystemExit("list-files: the archive holds more than one image")
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        out = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"])), mode="r:*") as lt:
                apply_layer(out, lt)
        return out


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: list-files.py DIRECTORY | IMAGE.oci.tar | EXPORT.tar | -")
    src = sys.argv[1]
    if src == "-":
        entries = from_tar(io.BytesIO(sys.stdin.buffer.read()))
    elif os.path.isdir(src):
        entries = from_dir(src)
    else:
        with open(src, "rb") as f:
            entries = from_tar(f)
    for path in sorted(p for p in entries if not skipped(p)):
        kind, mode, uid, gid, target = entries[path]
        line = f"{kind} {mode:04o} {uid}:{gid} {path}"
        if target is not None:
            line += f" -> {target}"
        print(line)


if __name__ == "__main__":
    main()
