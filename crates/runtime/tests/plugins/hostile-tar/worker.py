#!/usr/bin/env python3
"""Test worker: a sandbox gone hostile. Every environmentExecute answers as
the base64 fallback download would, with a crafted payload chosen by the
remote path the host asked for (`case-NAME`). HOSTILE_OUTSIDE names a host
directory the payloads try to reach."""
import base64
import io
import json
import os
import re
import sys
import tarfile

OUTSIDE = os.environ.get("HOSTILE_OUTSIDE", "/nonexistent-outside")


def info(name, kind=tarfile.REGTYPE, size=0, mode=0o644, link=""):
    t = tarfile.TarInfo(name)
    t.type, t.size, t.mode, t.linkname = kind, size, mode, link
    return t


def archive(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.addfile(info(".", tarfile.DIRTYPE, mode=0o755))
        for t, data in entries:
            tf.addfile(t, io.BytesIO(data) if data else None)
    return buf.getvalue()


def file(name, data=b"x", mode=0o644):
    return info(name, size=len(data), mode=mode), data


def claims_huge():
    # a header claiming 1 TiB with no data behind it
    t = info("huge.bin", size=1 << 40)
    return info(".", tarfile.DIRTYPE, mode=0o755).tobuf(tarfile.GNU_FORMAT) + \
        t.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024


CASES = {
    "dotdot": lambda: archive([file("ok.txt"), file("../escape.txt")]),
    "absolute": lambda: archive([file(OUTSIDE + "/absolute.txt")]),
    "symlink-etc": lambda: archive([(info("etc", tarfile.SYMTYPE, link="/etc"), None),
                                    file("etc/sandhost-transfer-canary")]),
    "symlink-out": lambda: archive([(info("up", tarfile.SYMTYPE, link="../../outside"), None),
                                    file("up/through.txt")]),
    "symlink-chain": lambda: archive([(info("d", tarfile.DIRTYPE, mode=0o755), None),
                                      (info("d/l", tarfile.SYMTYPE, link=".."), None),
                                      (info("x", tarfile.SYMTYPE, link="d/l/.."), None)]),
    "hardlink": lambda: archive([file("a.txt"),
                                 (info("passwd", tarfile.LNKTYPE, link="/etc/passwd"), None)]),
    "device": lambda: archive([(info("null", tarfile.CHRTYPE), None)]),
    "fifo": lambda: archive([(info("pipe", tarfile.FIFOTYPE), None)]),
    "setuid": lambda: archive([file("tool", b"#!/bin/sh\n", mode=0o4755),
                               file("group", b"g", mode=0o2750),
                               (info("shared", tarfile.DIRTYPE, mode=0o1777), None)]),
    "many-entries": lambda: archive([file("f%03d" % i) for i in range(50)]),
    "many-bytes": lambda: archive([file("f%d" % i, b"b" * 600) for i in range(3)]),
    "claims-huge": claims_huge,
}


def answer(script):
    m = re.search(r"p='case-([a-z-]+)'", script)
    case = m.group(1) if m else ""
    if case == "huge-file":
        return "file\n" + base64.encodebytes(b"z" * 4096).decode()
    if case not in CASES:
        return "missing\n"
    return "directory\n" + base64.encodebytes(CASES[case]()).decode()


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            result = {"ok": True, "supportedMethods": [
                "initialize", "health", "shutdown", "environmentAcquireLease", "environmentExecute"]}
        elif method == "health":
            result = {"status": "ok"}
        elif method == "environmentAcquireLease":
            result = {"providerLeaseId": "hostile", "expiresAt": None}
        elif method == "environmentExecute":
            result = {"exitCode": 0, "timedOut": False, "stderr": "",
                      "stdout": answer((params.get("args") or ["", ""])[-1])}
        elif method == "shutdown":
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": None}), flush=True)
            return
        else:
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                              "error": {"code": -32004, "message": "not implemented"}}), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)


if __name__ == "__main__":
    main()
