#!/usr/bin/env python3
"""A TCP proxy that can drop every open connection, to cut a client's watch.

    drop_proxy.py PORT_FILE UPSTREAM_FILE

Listens on a free loopback port and writes it to PORT_FILE; each connection is
forwarded to the address read from UPSTREAM_FILE at that moment (so the
daemon behind it may restart on another port). SIGUSR1 shuts down every open
connection; clients see their calls fail with UNAVAILABLE and connect again.
"""

import os
import signal
import socket
import sys
import threading

port_file, upstream_file = sys.argv[1], sys.argv[2]
lock = threading.Lock()
open_sockets = set()


def pump(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client):
    try:
        with open(upstream_file) as f:
            host, port = f.read().strip().rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)), timeout=5)
        upstream.settimeout(None)
    except (OSError, ValueError):
        client.close()  # the daemon is away: the client sees UNAVAILABLE
        return
    with lock:
        open_sockets.update((client, upstream))
    threads = [threading.Thread(target=pump, args=p, daemon=True) for p in ((client, upstream), (upstream, client))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with lock:
        open_sockets.difference_update((client, upstream))
    client.close()
    upstream.close()


def drop(*_):
    with lock:
        victims = list(open_sockets)
    for s in victims:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    print(f"drop_proxy: dropped {len(victims) // 2} connection(s)", file=sys.stderr, flush=True)


signal.signal(signal.SIGUSR1, drop)
listener = socket.create_server(("127.0.0.1", 0))
with open(port_file + ".tmp", "w") as f:
    f.write(str(listener.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
