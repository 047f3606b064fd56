"""Sends one Redis command many times, pipelined, for measuring what the command costs Redis
(INFO commandstats and CPU are read around it by the caller). Like redis-benchmark, but an
argument can hold binary bytes, as tollgate's packed arguments do.

    python3 scripts/lib/call_load.py PORT CALLS KEYSPACE ARG...

Every `__rand_int__` in an argument becomes a random number below KEYSPACE, drawn anew for
each occurrence in each call. An argument `i64le:N,N,...` is sent as those numbers packed as
little-endian signed 64-bit integers (lua/prelude.lua's packed arguments). Calls go in
batches of 32 on one connection, each batch sent whole before its replies are read. Exits
non-zero, naming it, on the first error reply.
"""

import random
import socket
import struct
import sys

IN_FLIGHT = 32
PLACEHOLDER = b"__rand_int__"


def argument(text):
    if text.startswith("i64le:"):
        return struct.pack(f"<{text.count(',') + 1}q", *map(int, text[6:].split(",")))
    return text.encode()


def encode(parts, keyspace):
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        while PLACEHOLDER in part:
            part = part.replace(PLACEHOLDER, b"%012d" % random.randrange(keyspace), 1)
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class Replies:
    """Reads whole RESP replies off a socket."""

    def __init__(self, sock):
        self.sock, self.buffer, self.at = sock, b"", 0

    def line(self):
        while True:
            end = self.buffer.find(b"\r\n", self.at)
            if end >= 0:
                line, self.at = self.buffer[self.at:end], end + 2
                return line
            self.fill()

    def take(self, length):
        while len(self.buffer) - self.at < length + 2:
            self.fill()
        data = self.buffer[self.at:self.at + length]
        self.at += length + 2
        return data

    def fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            sys.exit("call_load: Redis closed the connection")
        self.buffer, self.at = self.buffer[self.at:] + data, 0

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            sys.exit(f"call_load: Redis answered {rest.decode(errors='replace')}")
        if kind == b"$" and int(rest) >= 0:
            self.take(int(rest))
        elif kind == b"*":
            for _ in range(max(int(rest), 0)):
                self.reply()


def main():
    port, calls, keyspace = (int(value) for value in sys.argv[1:4])
    parts = [argument(text) for text in sys.argv[4:]]
    sock = socket.create_connection(("127.0.0.1", port))
    replies = Replies(sock)
    answered = 0
    while answered < calls:
        batch = min(IN_FLIGHT, calls - answered)
        sock.sendall(b"".join(encode(parts, keyspace) for _ in range(batch)))
        for _ in range(batch):
            replies.reply()
        answered += batch


if __name__ == "__main__":
    main()
