#!/usr/bin/env python3
"""Capture what a Pyroscope client sends: a tiny HTTP server that answers 200
to every request and dumps each one to DIR/NNNN.{json,body}.

    python3 capture.py DIR PORT

DIR/NNNN.json holds method, path, query (parsed) and headers; DIR/NNNN.body the
raw body. Replay one to a real server with curl:
    curl -s -XPOST -H 'Content-Type: application/octet-stream' --data-binary @DIR/NNNN.body \
        "http://127.0.0.1:7392$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' DIR/NNNN.json)"
"""
import itertools
import json
import os
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUT = sys.argv[1]
PORT = int(sys.argv[2])
os.makedirs(OUT, exist_ok=True)
COUNTER = itertools.count()


class Handler(BaseHTTPRequestHandler):
    def _dump(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        n = next(COUNTER)
        parsed = urllib.parse.urlsplit(self.path)
        meta = {
            "method": self.command,
            "path": self.path,
            "route": parsed.path,
            "query": urllib.parse.parse_qs(parsed.query, keep_blank_values=True),
            "headers": dict(self.headers.items()),
            "body_len": len(body),
        }
        with open(os.path.join(OUT, f"{n:04d}.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(OUT, f"{n:04d}.body"), "wb") as f:
            f.write(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = _dump
    do_PUT = _dump
    do_GET = _dump

    def log_message(self, fmt, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
