#!/usr/bin/env python3
"""A worker for the conformance tests that lies about one thing, named by argv[1].

Everything else is honest: a lease is a directory under a private temp dir,
commands run as subprocesses there (stdin, env, cwd, timeoutMs honoured).

Modes:
- sync-not-implemented: advertises environmentSyncIn / environmentSyncOut but
  answers -32004 to both.
- resume-crash: advertises environmentResumeLease and exits when called.
- honest: no lie (sync is simply not advertised).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid

MODE = sys.argv[1] if len(sys.argv) > 1 else "honest"
STATE = tempfile.mkdtemp(prefix="sandhost-dishonest-")
LOCK = threading.Lock()


def send(obj):
    with LOCK:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


class Fail(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def root_of(lease_id):
    if not lease_id or "/" in lease_id or lease_id.startswith("."):
        raise Fail(-32602, "invalid providerLeaseId")
    return os.path.join(STATE, lease_id)


def lease(lease_id):
    return {"providerLeaseId": lease_id, "expiresAt": None}


def acquire(p):
    lease_id = "l-" + uuid.uuid4().hex
    os.makedirs(root_of(lease_id))
    return lease(lease_id)


def resume(p):
    if MODE == "resume-crash":
        sys.stderr.write("dishonest: resume is advertised but not really there\n")
        sys.stderr.flush()
        os._exit(7)
    lease_id = p.get("providerLeaseId")
    try:
        alive = os.path.isdir(root_of(lease_id))
    except Fail:
        alive = False
    if alive:
        return lease(lease_id)
    return {"providerLeaseId": None, "metadata": {"reason": "not_found"}, "expiresAt": None}


def end(p):
    lease_id = p.get("providerLeaseId")
    shutil.rmtree(root_of(lease_id), ignore_errors=True)
    return {"providerLeaseId": lease_id, "state": "destroyed"}


def execute(p):
    root = root_of((p.get("lease") or {}).get("providerLeaseId"))
    cwd = os.path.join(root, p.get("cwd") or ".")
    env = dict(os.environ)
    env.update(p.get("env") or {})
    proc = subprocess.Popen([p["command"]] + list(p.get("args") or []), cwd=cwd, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    timeout = p.get("timeoutMs")
    timed_out = False
    try:
        out, err = proc.communicate((p.get("stdin") or "").encode(),
                                    timeout=timeout / 1000.0 if timeout else None)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    code = proc.returncode
    return {"exitCode": None if timed_out or code < 0 else code, "timedOut": timed_out,
            "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}


def not_implemented(p):
    raise Fail(-32004, "not implemented")


HANDLERS = {
    "health": lambda p: {"status": "ok"},
    "environmentAcquireLease": acquire,
    "environmentResumeLease": resume,
    "environmentReleaseLease": end,
    "environmentDestroyLease": end,
    "environmentExecute": execute,
}
if MODE == "sync-not-implemented":
    HANDLERS["environmentSyncIn"] = not_implemented
    HANDLERS["environmentSyncOut"] = not_implemented


def handle(msg):
    rid, method, params = msg["id"], msg.get("method"), msg.get("params") or {}
    try:
        if method not in HANDLERS:
            raise Fail(-32004, "not implemented")
        send({"jsonrpc": "2.0", "id": rid, "result": HANDLERS[method](params)})
    except Fail as e:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": e.code, "message": str(e)}})
    except Exception as e:  # noqa: BLE001
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": repr(e)}})


def main():
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        if msg["method"] == "initialize":
            methods = ["initialize", "shutdown"] + list(HANDLERS)
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"ok": True, "supportedMethods": methods}})
        elif msg["method"] == "shutdown":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            break
        else:
            threading.Thread(target=handle, args=(msg,), daemon=True).start()
    shutil.rmtree(STATE, ignore_errors=True)


if __name__ == "__main__":
    main()
