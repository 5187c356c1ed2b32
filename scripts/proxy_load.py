#!/usr/bin/env python3
"""Closed-loop HTTP/1.1 load for instruction and syscall counts (scripts/callgrind-proxy.sh).

proxy_load.py HOST:PORT CONNECTIONS REQUESTS PROMPT_BYTES

Opens CONNECTIONS keep-alive connections and sends REQUESTS POST /v1/completions in all
(each connection one request at a time, the next sent when its response is complete), the
same non-streaming body as scripts/bench-proxy.sh with a PROMPT_BYTES-byte prompt. Exits
non-zero if any response is not a 200. Unlike wrk it sends an exact number of requests,
so counters divided by REQUESTS are per request. A connection the server closes after a
response (Connection: close, e.g. nginx after keepalive_requests) is opened again.
"""
import selectors
import socket
import sys


def body(prompt_bytes):
    prompt = ("The quick brown fox jumps over the lazy dog. " * (prompt_bytes // 45 + 1))[:prompt_bytes]
    return ('{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"%s","max_tokens":1}' % prompt).encode()


class Conn:
    def __init__(self, addr, request):
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = request
        self.buf = b""

    def send(self):
        self.sock.sendall(self.request)
        self.buf = b""

    def response_done(self):
        """Returns the status once a whole response is buffered, else None. Sets
        self.closing when the server announced it closes the connection after it."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buf[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        self.closing = fields.get("connection", "").lower() == "close"
        rest = self.buf[end + 4:]
        if "content-length" in fields:
            return status if len(rest) >= int(fields["content-length"]) else None
        if fields.get("transfer-encoding", "").lower() == "chunked":
            return status if rest.endswith(b"0\r\n\r\n") else None
        raise SystemExit("response without length: %r" % head)

    def reconnect(self, addr):
        self.sock.close()
        self.sock = socket.create_connection(addr)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    conns, total, prompt_bytes = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    b = body(prompt_bytes)
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (sys.argv[1].encode(), len(b))) + b
    sel = selectors.DefaultSelector()
    sent = done = 0
    pool = []
    for _ in range(min(conns, total)):
        c = Conn((host, int(port)), request)
        pool.append(c)
        sel.register(c.sock, selectors.EVENT_READ, c)
        c.send()
        sent += 1
    while done < total:
        for key, _ in sel.select():
            c = key.data
            data = c.sock.recv(1 << 16)
            if not data:
                raise SystemExit("connection closed by the server")
            c.buf += data
            status = c.response_done()
            if status is None:
                continue
            if status != 200:
                raise SystemExit("status %d: %r" % (status, c.buf[:300]))
            done += 1
            if c.closing:  # e.g. nginx after keepalive_requests (1000) on one connection
                sel.unregister(c.sock)
                c.reconnect((host, int(port)))
                sel.register(c.sock, selectors.EVENT_READ, c)
            if sent < total:
                c.send()
                sent += 1
    for c in pool:
        c.sock.close()


if __name__ == "__main__":
    main()
