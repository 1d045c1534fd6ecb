#!/usr/bin/python3
"""A claim whose COMMIT's reply is lost, repeated with its caller-chosen token (issue 15).

A TCP proxy between the client and PostgreSQL forwards the wire protocol and, when told to,
lets the client's COMMIT through to the server, swallows the server's reply and resets the
client's connection: the application cannot tell whether its claim committed. Repeating the
same idem_claim call with the same token then answers `claimed` with that token, attempts
unchanged, writing nothing; another worker's token still gets `in_progress`. The same holds
when the COMMIT itself is lost (the claim rolled back): the repeated call claims afresh with
the token. Uses Debian's python3-psycopg (/usr/bin/python3).

  tests/claim_retry/run.py --host HOST --port PORT --proxy-port PROXY_PORT

HOST is the server's unix socket directory (or a TCP address); the proxy listens on
127.0.0.1:PROXY_PORT (scripts/test.sh takes it from tests/lib.sh's port table). Needs a
server with the extension installed (the database idem_claim_retry is created afresh).
Last line: "claim-retry: N passed, M failed".
"""
import argparse
import os
import socket
import struct
import sys
import threading
import uuid

import psycopg

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


class LoseCommitProxy:
    """Forwards one PostgreSQL connection at a time; mode 'reply' loses the COMMIT's reply
    (the commit happens), mode 'commit' loses the COMMIT itself (the server sees the client
    go away, so the transaction rolls back), mode None forwards everything."""

    def __init__(self, listen_port, host, port):
        # A directory is a unix socket's, as for libpq.
        self.server = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
        self.mode = None
        self.lost = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", listen_port))
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            client, _ = self.listener.accept()
            if isinstance(self.server, str):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self.server)
            else:
                upstream = socket.create_connection(self.server)
            commit_sent = threading.Event()
            threading.Thread(target=self.client_to_server, args=(client, upstream, commit_sent), daemon=True).start()
            threading.Thread(target=self.server_to_client, args=(upstream, client, commit_sent), daemon=True).start()

    @staticmethod
    def reset(sock):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)  # also wakes the other thread's recv on it
        except OSError:
            pass
        sock.close()

    def client_to_server(self, client, upstream, commit_sent):
        buf, started = b"", False
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    if not started:  # the startup message has no type byte
                        if len(buf) < 4 or len(buf) < int.from_bytes(buf[:4], "big"):
                            break
                        n = int.from_bytes(buf[:4], "big")
                        msg, buf, started = buf[:n], buf[n:], True
                    else:
                        if len(buf) < 5 or len(buf) < 1 + int.from_bytes(buf[1:5], "big"):
                            break
                        n = 1 + int.from_bytes(buf[1:5], "big")
                        msg, buf = buf[:n], buf[n:]
                        is_commit = msg[:1] in (b"Q", b"P") and b"COMMIT" in msg.upper()
                        if is_commit and self.mode == "commit":
                            self.lost.set()
                            self.reset(client)
                            self.reset(upstream)
                            return
                        if is_commit and self.mode == "reply":
                            commit_sent.set()
                    upstream.sendall(msg)
        except OSError:
            pass

    def server_to_client(self, upstream, client, commit_sent):
        swallowed = b""
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if commit_sent.is_set():
                    swallowed += data
                    if b"Z\x00\x00\x00\x05" in swallowed:  # ReadyForQuery: the COMMIT is done
                        self.lost.set()
                        self.reset(client)
                        self.reset(upstream)
                        return
                    continue
                client.sendall(data)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default=os.environ.get("PGHOST"), required="PGHOST" not in os.environ)
    ap.add_argument("--port", type=int, default=os.environ.get("PGPORT"), required="PGPORT" not in os.environ)
    ap.add_argument("--proxy-port", type=int, required=True)
    args = ap.parse_args()
    user = os.environ.get("PGUSER", "postgres")
    db = "idem_claim_retry"
    direct = dict(host=args.host, port=args.port, user=user, sslmode="disable")
    with psycopg.connect(dbname="postgres", autocommit=True, **direct) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db}")
    admin = psycopg.connect(dbname=db, autocommit=True, **direct)
    admin.execute("CREATE EXTENSION idempotency")
    proxy = LoseCommitProxy(args.proxy_port, args.host, args.port)
    via_proxy = dict(host="127.0.0.1", port=args.proxy_port, user=user, dbname=db, sslmode="disable")
    claim = "SELECT outcome, token, attempts FROM idempotency.idem_claim('acct_42', %s, 'fp', token => %s)"

    for mode, committed in (("reply", True), ("commit", False)):
        key = f"order-{mode}"
        token = uuid.uuid4()
        proxy.mode, proxy.lost = mode, threading.Event()
        app = psycopg.connect(**via_proxy)
        outcome = app.execute(claim, (key, token)).fetchone()
        check(f"lost {mode}: the first call claims with the caller's token",
              outcome[0] == "claimed" and outcome[1] == token, repr(outcome))
        error = None
        try:
            app.commit()
        except psycopg.Error as e:
            error = e
        check(f"lost {mode}: the application's COMMIT fails (connection lost)", error is not None, repr(error))
        check(f"lost {mode}: the proxy lost it", proxy.lost.wait(5))
        app.close()
        proxy.mode = None
        # What the server has now (waits for the lost connection's backend to finish).
        row = None
        for _ in range(100):
            busy = admin.execute(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' "
                                 "AND pid <> pg_backend_pid() AND state <> 'idle'").fetchone()[0]
            row = admin.execute("SELECT token, xmin::text FROM idempotency.keys WHERE key = %s", (key,)).fetchone()
            if busy == 0:
                break
            threading.Event().wait(0.05)
        check(f"lost {mode}: the claim {'committed' if committed else 'rolled back'}",
              (row is not None and row[0] == token) if committed else row is None, repr(row))

        again = psycopg.connect(autocommit=True, **via_proxy)
        before = admin.execute("SELECT xmin::text FROM idempotency.keys WHERE key = %s", (key,)).fetchone()
        outcome = again.execute(claim, (key, token)).fetchone()
        check(f"lost {mode}: the repeated call answers claimed with the same token, attempts 1",
              outcome == ("claimed", token, 1), repr(outcome))
        after = admin.execute("SELECT xmin::text, token FROM idempotency.keys WHERE key = %s", (key,)).fetchone()
        if committed:
            check(f"lost {mode}: the repeated call wrote nothing", before is not None and after[0] == before[0],
                  f"{before} -> {after}")
        check(f"lost {mode}: the record holds the caller's token", after is not None and after[1] == token, repr(after))
        other = again.execute(claim, (key, uuid.uuid4())).fetchone()
        check(f"lost {mode}: another worker's token gets in_progress", other[0] == "in_progress", repr(other))
        again.close()

    admin.close()
    with psycopg.connect(dbname="postgres", autocommit=True, **direct) as c:
        c.execute(f"DROP DATABASE {db}")
    print(f"claim-retry: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
