#!/usr/bin/python3
"""KV-event batches encoded by Debian's python3-msgpack, an encoder independent of kvroute.

Prints one line per payload: "<name> <hex>". The batch is the one kvevents tests build in
C++ (codec_test.cc, TestBatch); names say the form: array-int, array-bytes, map-int,
map-bytes (the four vLLM forms), old-two-items ([ts, events], negative int64 hashes),
extras (unknown trailing fields, keys and an unknown event tag).
"""
import sys

import msgpack

MASK = (1 << 64) - 1
LANES = (0x6B76726F75746531, 0x6B76726F75746532, 0x6B76726F75746533)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def digest(h):
    """The 32-byte digest kvroute's ExpandHash sends for hash h (last 8 bytes: h)."""
    words = [splitmix64(h ^ lane) for lane in LANES] + [h]
    return b"".join(w.to_bytes(8, "big") for w in words)


H = [0x0123456789ABCDEF, 0xFEDCBA9876543210, 42, 0x8000000000000001]
TOKENS = list(range(100, 132))
TOKENS3 = list(range(7000, 7016))


def events(hash_of, as_map, extras=False):
    def ev(tag, fields):
        if as_map:
            d = {"type": tag}
            d.update(fields)
            if extras:
                d["group_idx"] = 0
                d["some_future_key"] = [1, {"x": None}]
            return d
        row = [tag] + list(fields.values())
        if extras:
            row += [None, 0, "full_attention", None]
        return row

    out = [
        ev("BlockStored", {"block_hashes": [hash_of(H[0]), hash_of(H[1])],
                           "parent_block_hash": None, "token_ids": TOKENS,
                           "block_size": 16, "lora_id": None, "medium": "GPU"}),
        ev("BlockStored", {"block_hashes": [hash_of(H[2])], "parent_block_hash": hash_of(H[1]),
                           "token_ids": TOKENS3, "block_size": 16, "lora_id": None,
                           "medium": "GPU", "lora_name": "sql-lora"}),
        ev("BlockRemoved", {"block_hashes": [hash_of(H[3])], "medium": "CPU"}),
        ev("AllBlocksCleared", {}),
    ]
    if extras:
        out.insert(1, ["SomeNewEvent", 1, 2, 3] if not as_map else {"type": "SomeNewEvent", "a": 1})
    return out


def as_int(h):
    return h


def as_signed(h):
    return h - (1 << 64) if h >= (1 << 63) else h


def main():
    payloads = {
        "array-int": [1.5, events(as_int, False), 0],
        "array-bytes": [1.5, events(digest, False), 0],
        "map-int": [1.5, events(as_int, True), 0],
        "map-bytes": [1.5, events(digest, True), 0],
        "old-two-items": [1.5, events(as_signed, False)],
        "extras": [1.5, events(as_int, False, extras=True), 0, "future"],
        "map-batch": {"ts": 1.5, "events": events(as_int, True, extras=True),
                      "data_parallel_rank": 0},
    }
    for name, obj in payloads.items():
        sys.stdout.write(name + " " + msgpack.packb(obj, use_bin_type=True).hex() + "\n")


if __name__ == "__main__":
    main()
