#!/usr/bin/env python3
"""TCP server for proof.sh: answers every connection with its name and the
address the connection reached, then closes.  server.py NAME PORT"""
import socketserver
import sys


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        addr = self.request.getsockname()[0]
        self.request.sendall(f"{sys.argv[1]} {addr}\n".encode())


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024


if __name__ == "__main__":
    with Server(("0.0.0.0", int(sys.argv[2])), Handler) as s:
        s.serve_forever()
