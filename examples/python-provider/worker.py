#!/usr/bin/env python3
"""Reference sandhost provider worker: NDJSON JSON-RPC 2.0 over stdin/stdout.

A lease is a directory under the state dir; commands run there as plain
subprocesses. This is NOT a security sandbox: it isolates nothing.
stdout carries protocol only; logs go to stderr.
"""
import codecs
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid

STATE_DIR = os.environ.get("SANDHOST_STATE_DIR") or os.path.join(
    tempfile.gettempdir(), "sandhost-python-provider")
INCREMENTAL_OUTPUT = True  # keep in line with plugin.json incrementalSessionOutput

NOT_FOUND, INVALID_PARAMS, WORKER_ERROR, NOT_IMPLEMENTED = -32601, -32602, -32002, -32004
_write_lock = threading.Lock()


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def log(*parts):
    print("python-provider:", *parts, file=sys.stderr, flush=True)


def send(message):
    line = json.dumps(message, separators=(",", ":")) + "\n"
    with _write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def notify(method, params):
    send({"jsonrpc": "2.0", "method": method, "params": params})


# ---------------------------------------------------------------- leases

def lease_dir(lease_id):
    if not lease_id or "/" in lease_id or lease_id.startswith("."):
        raise RpcError(INVALID_PARAMS, "invalid providerLeaseId")
    return os.path.join(STATE_DIR, lease_id)


def lease_root(params):
    lease = params.get("lease") or {}
    root = os.path.join(lease_dir(lease.get("providerLeaseId")), "root")
    if not os.path.isdir(root):
        raise RpcError(WORKER_ERROR, "lease not found")
    return root


def confine(root, path):
    """Resolve a relative path inside root; refuse absolute paths and escapes."""
    path = path or "."
    if os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        raise RpcError(INVALID_PARAMS, "path escapes the lease root: %s" % path)
    full = os.path.join(root, path)
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(os.path.dirname(full))
    if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
        raise RpcError(INVALID_PARAMS, "path escapes the lease root: %s" % path)
    return full


def lease_object(lease_id):
    return {"providerLeaseId": lease_id, "metadata": {"root": os.path.join(STATE_DIR, lease_id, "root")},
            "expiresAt": None}


def acquire_lease(params):
    lease_id = "lease-" + uuid.uuid4().hex
    os.makedirs(os.path.join(STATE_DIR, lease_id, "root"), mode=0o700)
    return lease_object(lease_id)


def resume_lease(params):
    lease_id = params.get("providerLeaseId")
    try:
        exists = os.path.isdir(os.path.join(lease_dir(lease_id), "root"))
    except RpcError:
        exists = False
    if not exists:
        return {"providerLeaseId": None, "metadata": {"reason": "not_found"}, "expiresAt": None}
    return lease_object(lease_id)


def end_lease(params):
    lease_id = params.get("providerLeaseId")
    shutil.rmtree(lease_dir(lease_id), ignore_errors=True)
    return {"providerLeaseId": lease_id, "state": "destroyed"}


# ---------------------------------------------------------------- execute

def pump(pipe, stream, request_id, sink):
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        data = os.read(pipe.fileno(), 65536)
        text = decoder.decode(data, final=not data)
        if text:
            sink.append(text)
            if INCREMENTAL_OUTPUT:
                notify("execute.log", {"requestId": request_id, "stream": stream, "chunk": text})
        if not data:
            return


def execute(params, request_id):
    root = lease_root(params)
    command = params.get("command")
    if not isinstance(command, str) or not command:
        raise RpcError(INVALID_PARAMS, "command must be a non-empty string")
    env = dict(os.environ)
    env.update(params.get("env") or {})
    timeout_ms = params.get("timeoutMs")
    proc = subprocess.Popen([command] + list(params.get("args") or []), cwd=confine(root, params.get("cwd")),
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    out, err = [], []
    pumps = [threading.Thread(target=pump, args=(proc.stdout, "stdout", request_id, out)),
             threading.Thread(target=pump, args=(proc.stderr, "stderr", request_id, err))]
    for t in pumps:
        t.start()
    try:
        proc.stdin.write((params.get("stdin") or "").encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=timeout_ms / 1000.0 if timeout_ms else None)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, grandchildren too
        proc.wait()
    for t in pumps:
        t.join()
    code = proc.returncode
    result = {"exitCode": code if code >= 0 and not timed_out else None, "timedOut": timed_out,
              "stdout": "".join(out), "stderr": "".join(err)}
    if code < 0:
        result["signal"] = signal.Signals(-code).name
    return result


# ---------------------------------------------------------------- sync

def copy_file_atomic(src, dst, mode):
    """Temp file in the target's directory, mode set before rename, then rename."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".sync-")  # created 0600
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(dst)


def copy_dir_replace(src, dst, mapping):
    """Copy to a temp dir beside the target, then destroy the old one and rename."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(dst), prefix=".sync-")
    staged = os.path.join(tmp, "tree")
    ignore = shutil.ignore_patterns(*mapping["exclude"]) if mapping.get("exclude") else None
    shutil.copytree(src, staged, symlinks=not mapping.get("followSymlinks", False), ignore=ignore)
    if mapping.get("mode") is not None:
        os.chmod(staged, mapping["mode"])
    if os.path.lexists(dst):
        shutil.rmtree(dst) if os.path.isdir(dst) and not os.path.islink(dst) else os.unlink(dst)
    os.rename(staged, dst)
    os.rmdir(tmp)
    files = sizes = 0
    for base, _, names in os.walk(dst):
        for name in names:
            files += 1
            sizes += os.lstat(os.path.join(base, name)).st_size
    return files, sizes


def parse_mode(mode):
    return int(mode, 8) if isinstance(mode, str) else mode


def sync(params, direction):
    root = lease_root(params)
    results = []
    for op in params.get("operations") or []:
        files = total = 0
        for m in op.get("files") or []:
            m = dict(m, mode=parse_mode(m.get("mode")))
            if direction == "in":
                src, dst = m["sourcePath"], confine(root, m["targetPath"])
            else:
                src, dst = confine(root, m["sourcePath"]), m["targetPath"]
            if m.get("kind") == "directory":
                n, size = copy_dir_replace(src, dst, m)
                files, total = files + n, total + size
            else:
                total += copy_file_atomic(src, dst, m["mode"])
                files += 1
        for cmd in (op.get("postUploadCommands") or []) if direction == "in" else []:
            done = subprocess.run(["/bin/sh", "-c", cmd["command"]], cwd=confine(root, cmd.get("cwd")),
                                  capture_output=True, timeout=(cmd.get("timeoutMs") or 60000) / 1000.0)
            if done.returncode != 0:
                raise RpcError(WORKER_ERROR, "post-upload command failed (%d): %s"
                               % (done.returncode, done.stderr.decode(errors="replace")[-500:]))
        results.append({"operationId": op.get("operationId"), "filesTransferred": files,
                        "bytesTransferred": total})
    return {"operations": results}


# ---------------------------------------------------------------- dispatch

HANDLERS = {
    "health": lambda p, rid: {"status": "ok"},
    "environmentAcquireLease": lambda p, rid: acquire_lease(p),
    "environmentResumeLease": lambda p, rid: resume_lease(p),
    "environmentReleaseLease": lambda p, rid: end_lease(p),
    "environmentDestroyLease": lambda p, rid: end_lease(p),
    "environmentExecute": execute,
    "environmentSyncIn": lambda p, rid: sync(p, "in"),
    "environmentSyncOut": lambda p, rid: sync(p, "out"),
}
KNOWN_OPTIONAL = {
    "environmentValidateConfig", "environmentProbe", "environmentRealizeWorkspace",
    "duplexChannelOpen", "duplexChannelWrite", "duplexChannelResize", "duplexChannelStop",
    "duplexChannelClose",
}


def handle(request):
    rid, method, params = request["id"], request.get("method"), request.get("params") or {}
    try:
        if method == "initialize":
            # Derived from the handler table, never a separate list.
            result = {"ok": True, "supportedMethods": ["initialize", "shutdown"] + list(HANDLERS)}
        elif method in HANDLERS:
            result = HANDLERS[method](params, rid)
        elif method in KNOWN_OPTIONAL:
            raise RpcError(NOT_IMPLEMENTED, "method `%s` is not implemented" % method)
        else:
            raise RpcError(NOT_FOUND, "method `%s` not found" % method)
        send({"jsonrpc": "2.0", "id": rid, "result": result})
    except RpcError as e:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": e.code, "message": str(e)}})
    except (KeyError, TypeError, ValueError) as e:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": INVALID_PARAMS, "message": "invalid params: %s" % e}})
    except Exception as e:  # noqa: BLE001 - every failure is reported, loudly
        log("error in", method, repr(e))
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": WORKER_ERROR, "message": str(e)}})


def main():
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
            continue
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            send({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "invalid request"}})
            continue
        if "id" not in msg or "method" not in msg:
            continue  # notifications and responses from the host need no answer
        if msg["method"] == "shutdown":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            return
        threading.Thread(target=handle, args=(msg,), daemon=True).start()  # one thread per request


if __name__ == "__main__":
    main()
