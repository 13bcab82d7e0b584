"""A scripted worker for the supervisor tests: honest handshake, then it
misbehaves on `environmentExecute` in the way named by argv[1]."""
import json, sys, time

MODE = sys.argv[1] if len(sys.argv) > 1 else "honest"
out = sys.stdout

def send(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()

def result(rid, value):
    send({"jsonrpc": "2.0", "id": rid, "result": value})

held = []
for line in sys.stdin:
    msg = json.loads(line)
    rid, method = msg.get("id"), msg.get("method")
    params = msg.get("params") or {}
    if method == "initialize":
        if MODE == "init-not-ok":
            result(rid, {"ok": False, "supportedMethods": []})
            continue
        result(rid, {"ok": True, "supportedMethods": ["environmentExecute"]})
    elif method == "health":
        result(rid, {"status": "ok"})
    elif method == "shutdown":
        result(rid, {})
        if MODE != "ignore-shutdown":
            sys.exit(0)
    elif method == "environmentExecute":
        cmd = params.get("command")
        if MODE == "crash":
            sys.stderr.write("about to crash\n"); sys.stderr.flush()
            sys.exit(3)
        elif MODE == "hang":
            time.sleep(3600)
        elif MODE == "garbage":
            out.write("this is not json\n"); out.flush()
        elif MODE == "oversized":
            out.write('{"jsonrpc":"2.0","id":%d,"result":{"stdout":"%s"}}\n' % (rid, "x" * 300000)); out.flush()
        elif MODE == "stderr-flood":
            for _ in range(2000):
                sys.stderr.write("noise " * 200 + "\n")
            sys.stderr.flush()
            result(rid, {"exitCode": 0, "timedOut": False, "stdout": cmd, "stderr": ""})
        elif MODE == "out-of-order":
            held.append((rid, cmd))
            if len(held) == 3:
                for hid, hcmd in reversed(held):
                    send({"jsonrpc": "2.0", "method": "execute.log", "params": {"requestId": hid, "stream": "stdout", "chunk": "log:" + hcmd}})
                    result(hid, {"exitCode": 0, "timedOut": False, "stdout": hcmd, "stderr": ""})
                held.clear()
        else:
            result(rid, {"exitCode": 0, "timedOut": False, "stdout": cmd, "stderr": ""})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32004, "message": "not implemented"}})
