#!/usr/bin/env python3
"""Test worker: the Python example worker, plus a writer racing the host in
a deterministic order. Right after it answers the exec that reads the first
chunk (`dd ... skip=0`) of a fallback download, it changes the file read,
by the file's name: `flip-*` keeps the size and changes one byte, `grow-*`
appends, `shrink-*` cuts the file to half."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "..", "examples", "python-provider"))

import worker as base  # noqa: E402


def change(path):
    name = os.path.basename(path)
    if name.startswith("flip-"):
        with open(path, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
    elif name.startswith("grow-"):
        with open(path, "ab") as f:
            f.write(b"more")
    elif name.startswith("shrink-"):
        os.truncate(path, os.path.getsize(path) // 2)


def execute(params, request_id):
    result = base.execute(params, request_id)
    script = (params.get("args") or [""])[-1]
    m = re.search(r"p='([^']*)'", script)
    if m and "dd if=" in script and "skip=0 " in script:
        change(os.path.join(base.lease_root(params), m.group(1)))
    return result


base.HANDLERS["environmentExecute"] = execute

if __name__ == "__main__":
    base.main()
