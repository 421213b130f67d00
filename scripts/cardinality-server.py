#!/usr/bin/env python3
"""Times frostdb serve with one push of N distinct label names: push, /labels, /series, then
SIGTERM, restart, the first /labels (opens the tenant), /series. Usage: BIN DATA N [--kill] [--base] (--kill: kill -9 instead of SIGTERM, so the restart
replays the WAL; --base: a build without the label limits, which has no such config key)"""
import base64, json, os, signal, socket, subprocess, sys, time, urllib.request

binary, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
kill = "--kill" in sys.argv
profile = open(os.path.join(os.environ.get("FROSTDB_SHARED", "../shared"), "testdata/pprof/pyroscope__go-cpu.pb.gz"), "rb").read()
os.makedirs(data, exist_ok=True)
config = os.path.join(data, "..", os.path.basename(data) + ".toml")
open(config, "w").write("" if "--base" in sys.argv else "[limits]\nmax_label_names_per_series = 100000\n")

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def start():
    p = port()
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{p}", "--data", data, "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{p}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/api/v1/profile_types", timeout=600).read(); return proc, url
        except Exception:
            time.sleep(0.1)
    raise SystemExit("server did not start")

def timed(url, body=None, headers={}):
    t = time.time()
    r = urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=3600)
    out = r.read()
    return time.time() - t, r.status, out

proc, url = start()
labels = [{"name": "__name__", "value": "process_cpu"}, {"name": "service_name", "value": "wide"}]
labels += [{"name": f"l{i:05}", "value": f"v{i}"} for i in range(n)]
req = json.dumps({"series": [{"labels": labels, "samples": [{"rawProfile": base64.b64encode(profile).decode()}]}]}).encode()
res = {}
res["push_s"], status, _ = timed(url + "/push.v1.PusherService/Push", req, {"content-type": "application/json"})
assert status == 200, status
res["labels_s"], _, body = timed(url + "/api/v1/labels")
assert len(json.loads(body)) == n + 1, len(json.loads(body))
res["series_s"], _, _ = timed(url + "/api/v1/series")
t = time.time()
if kill:
    proc.kill()
else:
    proc.send_signal(signal.SIGTERM)
proc.wait(timeout=3600)
res["stop_s"] = time.time() - t
t = time.time()
proc, url = start()
res["restart_until_serving_s"] = time.time() - t
res["labels_after_restart_s"], _, body = timed(url + "/api/v1/labels")
assert len(json.loads(body)) == n + 1
res["series_after_restart_s"], _, _ = timed(url + "/api/v1/series")
res["labels_again_s"], _, _ = timed(url + "/api/v1/labels")
proc.send_signal(signal.SIGTERM); proc.wait(timeout=3600)
print(json.dumps({k: round(v, 3) for k, v in res.items()}))
