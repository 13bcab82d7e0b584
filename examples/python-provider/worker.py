#!/usr/bin/env python3
"""Reference sandhost provider worker: NDJSON JSON-RPC 2.0 over stdin/stdout.

A lease is a directory under the state dir; commands run there as plain
subprocesses. This is NOT a security sandbox: it isolates nothing.
stdout carries protocol only; logs go to stderr.
"""
import codecs
import fnmatch
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import uuid

STATE_DIR = os.environ.get("SANDHOST_STATE_DIR") or os.path.join(
    tempfile.gettempdir(), "sandhost-python-provider")
INCREMENTAL_OUTPUT = True  # keep in line with plugin.json incrementalSessionOutput
MAX_SYNC_BYTES, MAX_SYNC_ENTRIES = 1 << 30, 100000  # per sync call; config maxSyncBytes / maxSyncEntries

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
    lease_id = (params.get("lease") or {}).get("providerLeaseId")
    root = os.path.join(lease_dir(lease_id), "root")
    if not os.path.isdir(root):
        raise RpcError(WORKER_ERROR, "lease not found")
    if os.path.exists(os.path.join(lease_dir(lease_id), "released")):
        raise RpcError(WORKER_ERROR, "lease %s is released; resume it first" % lease_id)
    return root


def inside(root, path):
    return path == root or path.startswith(root + os.sep)


def confine(root, path):
    """The real path of a lease-side path; it must resolve inside the lease root.

    Relative paths are taken from the root; an absolute one must point into it.
    Symlinks are resolved, the last component included, so that none leads out.
    """
    path = path or "."
    if ".." in path.replace("\\", "/").split("/"):
        raise RpcError(INVALID_PARAMS, "path escapes the lease root: %s" % path)
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, path))
    if not inside(real_root, real):
        raise RpcError(INVALID_PARAMS, "path escapes the lease root: %s" % path)
    return real


def host_path(path):
    """Host-side paths must be absolute: the worker's own cwd means nothing to the host."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise RpcError(INVALID_PARAMS, "host-side paths must be absolute: %r" % (path,))
    return path


def lease_object(lease_id):
    return {"providerLeaseId": lease_id, "metadata": {"root": os.path.join(STATE_DIR, lease_id, "root")},
            "expiresAt": None}


def acquire_lease(params):
    lease_id = "lease-" + uuid.uuid4().hex
    os.makedirs(os.path.join(STATE_DIR, lease_id, "root"), mode=0o700)
    return lease_object(lease_id)


def resume_lease(params):
    """A live or released lease comes back (released ones become live again)."""
    lease_id = params.get("providerLeaseId")
    try:
        exists = os.path.isdir(os.path.join(lease_dir(lease_id), "root"))
    except RpcError:
        exists = False
    if not exists:
        return {"providerLeaseId": None, "metadata": {"reason": "not_found"}, "expiresAt": None}
    remove(os.path.join(lease_dir(lease_id), "released"))
    return lease_object(lease_id)


def release_lease(params):
    """Keep the directory for a later resume; only mark the lease released."""
    lease_id = params.get("providerLeaseId")
    if not os.path.isdir(lease_dir(lease_id)):
        return {"providerLeaseId": lease_id, "state": "destroyed"}
    open(os.path.join(lease_dir(lease_id), "released"), "w").close()
    return {"providerLeaseId": lease_id, "state": "stopped"}


def destroy_lease(params):
    lease_id = params.get("providerLeaseId")
    remove(lease_dir(lease_id))  # destroying a lease that is already gone is fine
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

def perm(st_mode):
    """Permission bits only: setuid, setgid and sticky are never copied."""
    return stat.S_IMODE(st_mode) & 0o777


def remove(path):
    """Delete a file, a symlink or a whole tree (read-only directories included)."""
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        for base, dirs, _ in os.walk(path):  # top-down: made writable before entered
            for d in dirs:
                if not os.path.islink(os.path.join(base, d)):
                    os.chmod(os.path.join(base, d), 0o700)
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


class Budget:
    """Byte and entry caps for one sync call, counted before anything is written."""

    def __init__(self, config):
        self.max_bytes = config.get("maxSyncBytes", MAX_SYNC_BYTES)
        self.max_entries = config.get("maxSyncEntries", MAX_SYNC_ENTRIES)
        for value in (self.max_bytes, self.max_entries):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RpcError(INVALID_PARAMS, "maxSyncBytes and maxSyncEntries must be positive integers")
        self.bytes = self.entries = 0

    def add(self, path, st):
        self.entries += 1
        self.bytes += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if self.entries > self.max_entries:
            raise RpcError(WORKER_ERROR, "sync refused: more than maxSyncEntries=%d entries (at %s); "
                           "nothing was written" % (self.max_entries, path))
        if self.bytes > self.max_bytes:
            raise RpcError(WORKER_ERROR, "sync refused: more than maxSyncBytes=%d bytes (at %s); "
                           "nothing was written" % (self.max_bytes, path))


def scan_tree(src, mapping, budget):
    """List a directory's entries as (relative path, stat, symlink target or None).

    Symlinks are kept only if relative and resolving inside the tree; with
    followSymlinks, such a link to a file is copied as that file (links to
    directories stay links, as following them could loop). Anything that is
    not a file, directory or symlink is refused.
    """
    real_src, exclude, entries = os.path.realpath(src), mapping.get("exclude") or [], []

    def walk(rel):
        for entry in sorted(os.scandir(os.path.join(src, rel)), key=lambda e: e.name):
            if any(fnmatch.fnmatch(entry.name, pattern) for pattern in exclude):
                continue
            path, st, link = os.path.join(rel, entry.name), entry.stat(follow_symlinks=False), None
            if stat.S_ISLNK(st.st_mode):
                link = os.readlink(entry.path)
                if os.path.isabs(link) or not inside(real_src, os.path.realpath(entry.path)):
                    raise RpcError(WORKER_ERROR, "sync refused: symlink %s -> %s leaves the tree" % (path, link))
                if mapping.get("followSymlinks") and os.path.isfile(entry.path):
                    st, link = os.stat(entry.path), None
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise RpcError(WORKER_ERROR, "sync refused: %s is not a file, directory or symlink" % path)
            budget.add(path, st)
            entries.append((path, st, link))
            if link is None and stat.S_ISDIR(st.st_mode):
                walk(path)

    walk("")
    return entries


def plan(root, mapping, direction, budget):
    """Check one file mapping without writing anything: paths, kinds, symlinks, sizes."""
    if direction == "in":
        src, dst = host_path(mapping["sourcePath"]), confine(root, mapping["targetPath"])
    else:
        src, dst = confine(root, mapping["sourcePath"]), host_path(mapping["targetPath"])
    st = os.stat(src)
    if mapping.get("kind") == "directory":
        if not stat.S_ISDIR(st.st_mode):
            raise RpcError(WORKER_ERROR, "%s is not a directory" % mapping["sourcePath"])
        entries = scan_tree(src, mapping, budget)
    else:
        if not stat.S_ISREG(st.st_mode):
            raise RpcError(WORKER_ERROR, "%s is not a regular file" % mapping["sourcePath"])
        budget.add(mapping["sourcePath"], st)
        entries = None
    mode = mapping.get("mode")
    mode = int(mode, 8) if isinstance(mode, str) else mode
    return src, dst, st, entries, perm(mode if mode is not None else st.st_mode)


def copy_bytes(src, out, size):
    """Copy src into the open file out, refusing a file that grew since it was counted."""
    copied = 0
    with open(src, "rb") as inp:
        for chunk in iter(lambda: inp.read(1 << 20), b""):
            copied += len(chunk)
            if copied > size:
                raise RpcError(WORKER_ERROR, "%s grew during the sync" % src)
            out.write(chunk)
    return copied


def copy_file_atomic(src, dst, st, mode):
    """Temp file (0600) in the target's directory, mode set before the rename."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".sync-")
    try:
        with os.fdopen(fd, "wb") as out:
            size = copy_bytes(src, out, st.st_size)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)
    except BaseException:
        remove(tmp)
        raise
    return 1, size


def copy_dir_replace(src, dst, entries, mode):
    """Build the tree in a private (0700) temp dir beside the target, then
    destroy the old target and rename. The temp dir goes on every path."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(dst), prefix=".sync-")
    files = size = 0
    try:
        staged = os.path.join(tmp, "tree")
        os.mkdir(staged, 0o700)
        for rel, st, link in entries:
            out = os.path.join(staged, rel)
            if link is not None:
                os.symlink(link, out)
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(out, 0o700)
            else:
                with open(out, "xb") as f:
                    size += copy_bytes(os.path.join(src, rel), f, st.st_size)
                os.chmod(out, perm(st.st_mode))
                files += 1
        for rel, st, link in reversed(entries):  # directory modes last: read-only dirs were filled
            if link is None and stat.S_ISDIR(st.st_mode):
                os.chmod(os.path.join(staged, rel), perm(st.st_mode))
        os.chmod(staged, mode)
        remove(dst)
        os.rename(staged, dst)
    finally:
        remove(tmp)
    return files, size


def sync(params, direction):
    root = lease_root(params)
    budget = Budget(params.get("config") or {})
    # Check every mapping of every operation before the first byte is written.
    plans = [(op, [plan(root, m, direction, budget) for m in op.get("files") or []])
             for op in params.get("operations") or []]
    results = []
    for op, steps in plans:
        files = total = 0
        for src, dst, st, entries, mode in steps:
            n, size = (copy_file_atomic(src, dst, st, mode) if entries is None
                       else copy_dir_replace(src, dst, entries, mode))
            files, total = files + n, total + size
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
    "environmentReleaseLease": lambda p, rid: release_lease(p),
    "environmentDestroyLease": lambda p, rid: destroy_lease(p),
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
