#!/usr/bin/python3
"""A KV-event subscriber built from Debian's python3-zmq and python3-msgpack only.

Usage: py_kv_subscriber.py ENDPOINT. Prints "ready", then for the first batch received
(within 20 s) one line per event: "BlockStored <hashes> <tokens> <block_size> <parent>"
(parent "nil" or "set"), "BlockRemoved <hashes>", "AllBlocksCleared"; then "seq <n>".
"""
import sys

import msgpack
import zmq

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
print("ready", flush=True)
if sub.poll(20000) == 0:
    print("timeout", flush=True)
    sys.exit(1)
topic, seq, payload = sub.recv_multipart()
ts, events, rank = msgpack.unpackb(payload, raw=False)
for ev in events:
    tag = ev[0]
    if tag == "BlockStored":
        parent = "nil" if ev[2] is None else "set"
        print(f"BlockStored {len(ev[1])} {len(ev[3])} {ev[4]} {parent}", flush=True)
    elif tag == "BlockRemoved":
        print(f"BlockRemoved {len(ev[1])}", flush=True)
    else:
        print(tag, flush=True)
print("seq", int.from_bytes(seq, "big"), "rank", rank, flush=True)
