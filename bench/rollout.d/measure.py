#!/usr/bin/env python3
"""bench/rollout.d/measure.py: what `kubectl rollout restart` of the proxy's DaemonSet does to the
sessions open through it, on the kit's real cluster (bench/rollout starts it and deploys the proxy).

    measure.py run RESULT.json --kubectl K --kubeconfig F --apiserver URL --api-ca F
                   --admin-cert F --admin-key F --node NAME --node-url URL --kubelet-ca F
                   --node-cert F --node-key F --namespace NS --daemonset NAME --pod-logs DIR
                   --kubelet-log FILE --ticker NS/POD --watch SECONDS --settle SECONDS --logs DIR
                   [--second-restart SECONDS]
    measure.py report RESULT.json CONTEXT.json    (Markdown on stdout)

`run` opens, through the proxy, a `kubectl logs -f` of a pod that prints a line a second and a
`kubectl exec -i POD -- sh` that is sent `echo tick N` every second, waits until both deliver,
restarts the DaemonSet (t = 0) and `kubectl rollout status` at once, and records, on one clock:

- every line each session delivers and when it ends (or, at --watch seconds, that it is still
  open: it is then ended by this script);
- the DaemonSet's pods (watched on the API server: created, ready, deletion asked, labels such as
  kubelet-auth-proxy/draining, released by the DaemonSet, gone) and status;
- the proxy processes on the node (from /proc: the kit's containers share this network namespace,
  as hostNetwork pods do, which tells them from other clusters' processes on the host) and whose
  pod each belongs to (its cgroup names the pod's UID);
- requests through the proxy all along: a new TCP and TLS connection to the node's address every
  0.2 s (a refused connection shows here first), and `nodes/<node>/proxy/healthz` through the API
  server every 0.5 s (the path kubectl logs/exec take);
- the proxy pods' own logs, copied from the kubelet's log files as they are written (the old pod's
  log stays readable after the pod is gone, unlike `kubectl logs`, and is not read through the
  proxy being measured), with the messages about the handover and the shutdown.

After --watch seconds the sessions still open are ended, and for up to --settle seconds more the
script waits for `rollout status` and for the old pods and processes to go, so that what a
session held open is seen to be released.

With --second-restart SECONDS, two rollouts in a row: the pod serving before is A, the first
rollout's new pod B, the second's C. Once the first `rollout status` has returned and B is ready,
a second `logs -f` and `exec -i` pair is opened (B takes it: the report says which proxy logged
each session's request in its audit events, and which process holds which client connection,
from /proc); at SECONDS after the first restart the DaemonSet is restarted again, with a second
`rollout status`. The clock stays the first restart's; --watch counts from it.
"""
import argparse
import datetime
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

mono = time.monotonic
LOCK = threading.Lock()
EVENTS = []  # (monotonic time, kind, text, extra dict)
CHILDREN = []  # the kubectl processes started, ended on the way out whatever happens


def event(kind, text, **extra):
    with LOCK:
        EVENTS.append((mono(), kind, text, extra))


def say(msg):
    print(f"bench/rollout: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the API server

class Api:
    def __init__(self, url, ca, cert, key):
        self.host, port = url.removeprefix("https://").rsplit(":", 1)
        self.port = int(port)
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)

    def conn(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def get(self, path, timeout=10):
        c = self.conn(timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def watch(self, path, on_object, stop):
        """Calls on_object(type, object) for each event of a watch on PATH (a list path), from the
        current state on; reconnects from the last resourceVersion when the stream ends.

        The first watch asks for resourceVersion 0, the watch cache's state as it is: without a
        resourceVersion the API server first waits until its cache has caught up with etcd's
        latest revision, which, with no write to that resource meanwhile, took from seconds to more
        than a minute on the kit's cluster."""
        rv = "0"
        while not stop.is_set():
            try:
                c = self.conn(None)
                sep = "&" if "?" in path else "?"
                c.request("GET", f"{path}{sep}watch=1&resourceVersion={rv}")
                r = c.getresponse()
                if r.status != 200:
                    raise OSError(f"watch {path}: HTTP {r.status}: {r.read()[:200]!r}")
                while not stop.is_set():
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    if ev["type"] == "ERROR":
                        rv = "0"  # expired: start again from the current state
                        break
                    rv = ev["object"]["metadata"].get("resourceVersion", rv)
                    on_object(ev["type"], ev["object"])
            except Exception as e:  # noqa: BLE001 -- any failure: say so, retry
                if not stop.is_set():
                    event("note", f"watch {path.split('?')[0]} broke ({e}); watching again")
                    time.sleep(0.5)


# ---------------------------------------------------------------- pods and the DaemonSet

class Pods:
    """The DaemonSet's pods (by generateName), with the moments their state changed."""

    def __init__(self, daemonset):
        self.prefix = daemonset + "-"
        self.pods = {}  # uid -> dict
        self.t0 = None
        self.t1 = None  # the second restart (--second-restart), if any
        # (t, pods not gone, pods with the draining label not gone), at each change
        self.series = []

    def state(self, pod):
        md, st = pod["metadata"], pod.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))
        container = "waiting"
        for cs in st.get("containerStatuses", []):
            s = cs.get("state", {})
            if "running" in s:
                container = "running"
            elif "terminated" in s:
                t = s["terminated"]
                container = f"exited {t.get('exitCode')}" + (f" ({t['reason']})" if t.get("reason") else "")
        return {
            "ready": ready,
            "deleting": "deletionTimestamp" in md,
            "labels": sorted(f"{k}={v}" for k, v in md.get("labels", {}).items() if "draining" in k),
            "owned": any(o.get("kind") == "DaemonSet" for o in md.get("ownerReferences", [])),
            "container": container,
            "phase": st.get("phase", "?"),
        }

    def on_object(self, kind, pod):
        md = pod["metadata"]
        if not md.get("generateName", "").startswith(self.prefix) and not md["name"].startswith(self.prefix):
            return
        uid, name = md["uid"], md["name"]
        now = mono()
        with LOCK:
            known = self.pods.get(uid)
            if known is None:
                known = self.pods[uid] = {"name": name, "uid": uid, "old": self.t0 is None,
                                          "role": "A" if self.t0 is None else "B" if self.t1 is None else "C",
                                          "seen": now, "state": {}, "times": {}}
                EVENTS.append((now, "pod+", f"pod {name} {'exists' if known['old'] else 'created'}", {"pod": name}))
            if kind == "DELETED":
                known["times"].setdefault("gone", now)
                EVENTS.append((now, "pod-", f"pod {name} gone (deleted from the API server)", {"pod": name}))
                self.count(now)
                return
            new, old = self.state(pod), known["state"]
            known["state"] = new
            changes = []
            if new["ready"] != old.get("ready", False):
                changes.append("ready" if new["ready"] else "not ready")
                known["times"].setdefault("ready" if new["ready"] else "unready", now)
            if new["deleting"] and not old.get("deleting"):
                changes.append("deletion asked (deletionTimestamp)")
                known["times"].setdefault("deleting", now)
            if new["labels"] != old.get("labels", []):
                changes.append("labels " + (", ".join(new["labels"]) or "without the draining label"))
                if new["labels"]:
                    known["times"].setdefault("labelled", now)
            if old and new["owned"] != old.get("owned"):
                changes.append("owned by the DaemonSet" if new["owned"] else "released by the DaemonSet (no ownerReference)")
                if not new["owned"]:
                    known["times"].setdefault("released", now)
            if new["container"] != old.get("container"):
                changes.append(f"container {new['container']}")
                if new["container"].startswith("exited"):
                    known["times"].setdefault("exited", now)
                    known["exit"] = new["container"]
            if changes:
                EVENTS.append((now, "pod", f"pod {name}: " + "; ".join(changes), {"pod": name}))
            self.count(now)

    def count(self, now):
        """Called with LOCK held: notes the number of pods, and of draining-labelled ones, if changed."""
        alive = [p for p in self.pods.values() if "gone" not in p["times"]]
        n = (len(alive), sum(1 for p in alive if p["state"].get("labels")))
        if not self.series or self.series[-1][1:] != n:
            self.series.append((now, *n))

    def names_by_uid(self):
        with LOCK:
            return {u: p["name"] for u, p in self.pods.items()}


class DaemonSetStatus:
    def __init__(self):
        self.last = None

    def on_object(self, kind, ds):
        st, gen = ds.get("status", {}), ds["metadata"].get("generation")
        text = (f"DaemonSet status: desired {st.get('desiredNumberScheduled', 0)}, "
                f"current {st.get('currentNumberScheduled', 0)}, updated {st.get('updatedNumberScheduled', 0)}, "
                f"ready {st.get('numberReady', 0)}, available {st.get('numberAvailable', 0)}, "
                f"unavailable {st.get('numberUnavailable', 0)}"
                + ("" if st.get("observedGeneration") == gen else f" (generation {gen} not yet observed)"))
        if text != self.last:
            self.last = text
            event("ds", text)


# ---------------------------------------------------------------- processes and pod logs on the node

POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
NETNS = os.readlink("/proc/self/ns/net")


def proxy_processes():
    """pid -> pod UID of the proxy processes in this network namespace (admin-probe runs excluded)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if not argv[0].endswith(b"kubelet-auth-proxy") or b"admin-probe" in argv:
                continue
            if os.readlink(f"/proc/{pid}/ns/net") != NETNS:
                continue
            m = POD_UID.search(open(f"/proc/{pid}/cgroup").read())
            found[int(pid)] = m.group(1).replace("_", "-") if m else "?"
        except OSError:
            continue
    return found


def tcp_address(hexaddr):
    """/proc/net/tcp's `0100007F:280A` (or tcp6's 32 hex digits) as `127.0.0.1:10250`."""
    addr, port = hexaddr.split(":")
    raw = bytes.fromhex(addr)
    # Each 32-bit word is in the host's (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{int(port, 16)}"
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return f"{socket.inet_ntop(socket.AF_INET, raw[12:])}:{int(port, 16)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"


def inbound_connections(port):
    """inode -> (local, remote) of the established TCP connections whose local port is PORT (this
    network namespace's, which the proxies share: they are hostNetwork)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "01" or int(f[1].rsplit(":", 1)[1], 16) != port:
                continue
            found[f[9]] = (tcp_address(f[1]), tcp_address(f[2]))
    return found


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


class Node:
    """Samples the proxy processes, and copies the proxy pods' log files as they grow."""

    def __init__(self, pods, pod_logs, namespace, daemonset, logs_dir):
        self.pods, self.pod_logs, self.logs_dir = pods, pod_logs, logs_dir
        self.prefix = f"{namespace}_{daemonset}-"
        self.procs = {}  # pid -> uid
        self.files = {}  # path -> (file, copy)
        self.counts = []  # (t, n)
        # The client connections each proxy process holds (accepted on :10250, established), by
        # socket inode: {"pid", "uid", "local", "remote", "first", "last"} (first and last seen).
        # The sessions are the ones that last: which process serves a session is which process
        # holds its connection.
        self.conns = {}

    def sample(self):
        procs = proxy_processes()
        names = self.pods.names_by_uid()
        for pid, uid in procs.items():
            if pid not in self.procs:
                event("proc+", f"proxy process {pid} ({names.get(uid, 'pod ' + uid[:8])}) running", pid=pid, uid=uid)
        for pid, uid in self.procs.items():
            if pid not in procs:
                event("proc-", f"proxy process {pid} ({names.get(uid, 'pod ' + uid[:8])}) exited", pid=pid, uid=uid)
        if not self.counts or self.counts[-1][1] != len(procs):
            self.counts.append((mono(), len(procs)))
        self.procs = procs
        inbound = inbound_connections(10250)
        now = mono()
        for pid, uid in procs.items():
            for inode in socket_inodes(pid) & inbound.keys():
                c = self.conns.get(inode)
                if c is None or c["pid"] != pid:
                    local, remote = inbound[inode]
                    c = self.conns[inode] = {"pid": pid, "uid": uid, "local": local, "remote": remote,
                                             "first": now, "last": now}
                c["last"] = now

    def follow(self):
        try:
            dirs = [d for d in os.listdir(self.pod_logs) if d.startswith(self.prefix)]
        except OSError:
            dirs = []
        for d in dirs:
            for root, _, names in os.walk(os.path.join(self.pod_logs, d)):
                for n in names:
                    path = os.path.join(root, n)
                    if path in self.files or not n.endswith(".log"):
                        continue
                    try:
                        f = open(path, "rb")  # kept open: readable after the kubelet removes it
                    except OSError:
                        continue
                    pod = d.split("_")[1]
                    container = os.path.basename(root)
                    self.files[path] = (f, open(os.path.join(self.logs_dir, f"{pod}.{container}.log"), "ab"), pod, container)
        for path, (f, copy, pod, container) in list(self.files.items()):
            data = f.read()
            if data:
                copy.write(data)
                copy.flush()
                if container != "copy-kubelet-serving-pair":
                    for line in data.decode(errors="replace").splitlines():
                        proxy_log_line(pod, line)

    def run(self, stop):
        while not stop.is_set():
            self.sample()
            self.follow()
            stop.wait(0.25)
        self.sample()
        self.follow()


LOG_LINES = []  # (wall time, pod, message)
INTERESTING = re.compile(r"hand|drain|SIGTERM|signal|shut|grace|stopp|label|releas|session|standing by|took the address|"
                         r"listening|exit|serv(es|ing) on|ready", re.I)


AUDIT = []  # (wall time, pod, stage, requestURI, auditID, code, requestReceivedTimestamp as wall time)
SESSION_URI = re.compile(r"^/(exec|attach|portForward)/|^/containerLogs/.*[?&]follow=true")


def wall_time(ts):
    """An RFC 3339 time with up to nanoseconds (Python reads microseconds at most) as a Unix time."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", ts)
    if not m:
        return None
    frac = (m.group(2) or ".0")[:7]
    return datetime.datetime.fromisoformat(m.group(1) + frac + m.group(3).replace("Z", "+00:00")).timestamp()


def audit_line(pod, text):
    """The proxy's audit events (stdout) of session requests: which pod's process took each one."""
    try:
        ev = json.loads(text)
    except ValueError:
        return
    uri = ev.get("requestURI", "") if isinstance(ev, dict) else ""
    if not SESSION_URI.search(uri):
        return
    at, received = wall_time(ev.get("stageTimestamp", "")), wall_time(ev.get("requestReceivedTimestamp", ""))
    if at is None:
        return
    with LOCK:
        AUDIT.append((at, pod, ev.get("stage"), uri, ev.get("auditID"), ev.get("responseStatus", {}).get("code"), received))


def proxy_log_line(pod, line):
    """A CRI log line (`TIME STREAM F|P TEXT`): keeps the proxy's own messages (stderr) that tell
    about the handover and the shutdown, with their time, and the audit events (stdout) of the
    session requests."""
    parts = line.split(" ", 3)
    if len(parts) == 4 and parts[1] == "stdout":
        audit_line(pod, parts[3])
        return
    if len(parts) < 4 or parts[1] != "stderr":
        return
    text = parts[3]
    try:
        obj = json.loads(text)
        msg = obj.get("msg") or obj.get("message") or obj.get("fields", {}).get("message") or text
        fields = obj.get("fields", obj)
        extra = {k: v for k, v in fields.items() if k not in ("message", "msg", "timestamp", "level", "target", "time")}
        if extra:
            msg = f"{msg} ({', '.join(f'{k}={v}' for k, v in list(extra.items())[:4])})"
    except ValueError:
        msg = text
    if not INTERESTING.search(msg):
        return
    ts = parts[0]
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", ts)
    if not m:
        return
    frac = (m.group(2) or ".0")[:7]
    wall = datetime.datetime.fromisoformat(m.group(1) + frac + m.group(3).replace("Z", "+00:00")).timestamp()
    with LOCK:
        LOG_LINES.append((wall, pod, msg[:300]))


KLOG = re.compile(r'^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)\s+\d+ \S+\] "([^"]+)"(.*)$')


def kubelet_lines(path, prefix, year):
    """What the kubelet's log says about the DaemonSet's pods that explains the timeline: probe
    results as they change (and each new failure message), the stop of a container with its grace
    period, the deletion. (wall time, text) pairs; klog writes the local time."""
    found, last_failure = [], {}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return found
    for i, line in enumerate(lines):
        m = KLOG.match(line)
        if not m or prefix not in m.group(8):
            continue
        mon, day, hh, mm, ss, frac, msg, rest = m.groups()
        wall = time.mktime((year, int(mon), int(day), int(hh), int(mm), int(ss), 0, 0, -1)) + float("0." + frac)
        pod = re.search(r'pods?=\[?"[^/"]+/([^"]+)"', rest)
        pod = pod.group(1) if pod else "?"
        kv = {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', rest)}
        if msg == "SyncLoop (probe)":
            text = f"{kv.get('probe')} probe: {kv.get('status')}"
        elif msg == "Probe failed":
            output = lines[i + 1].strip() if i + 1 < len(lines) else ""
            key = (pod, kv.get("probeType"))
            if last_failure.get(key) == output:
                continue
            last_failure[key] = output
            text = f"{kv.get('probeType')} probe failed: {output[:160]}"
        elif msg == "Killing container with a grace period":
            text = f"stopping container {kv.get('containerName')} (SIGTERM), grace period {kv.get('gracePeriod')} s"
        elif msg in ("SyncLoop DELETE", "SyncLoop REMOVE"):
            text = msg
        else:
            continue
        found.append((wall, f"kubelet, {pod}: {text}"))
    return found


# ---------------------------------------------------------------- requests through the proxy

class Prober:
    """Counts requests and failures of one probe, by cause, with the moments of the failures."""

    def __init__(self, name, interval, fn):
        self.name, self.interval, self.fn = name, interval, fn
        self.results = []  # (t, "ok" | cause)

    def run(self, stop):
        nxt = mono()
        while not stop.is_set():
            t = mono()
            try:
                result = self.fn()
            except ConnectionRefusedError:
                result = "connection refused"
            except ConnectionResetError:
                result = "connection reset"
            except (socket.timeout, TimeoutError):
                result = "timeout"
            except ssl.SSLError as e:
                result = f"TLS: {e.reason or e}"
            except Exception as e:  # noqa: BLE001 -- every failure is counted, by its kind
                result = f"{type(e).__name__}: {e}"[:120]
            with LOCK:
                self.results.append((t, result))
            nxt += self.interval
            stop.wait(max(0.0, nxt - mono()))


def direct_probe(url, ca, cert, key):
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)

    def probe():
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                head = s.recv(64)
        status = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else ""
        return "ok" if status == "200" else (f"HTTP {status}" if status else "closed without an answer")
    return probe


def apiserver_probe(api, node):
    def probe():
        status, body = api.get(f"/api/v1/nodes/{node}/proxy/healthz", timeout=10)
        return "ok" if status == 200 else f"HTTP {status}: {body[:80].decode(errors='replace')}"
    return probe


# ---------------------------------------------------------------- the sessions

class Session:
    """A kubectl session whose output lines are timed; `writer`, if any, feeds its stdin."""

    def __init__(self, name, argv, logs_dir, stdin=False):
        self.name, self.argv = name, argv
        self.lines = []  # (t, text)
        self.sent = []  # (t, n)
        self.end = None  # (t, returncode, how)
        self.start = mono()
        self.err = open(os.path.join(logs_dir, f"{name}.stderr"), "w+")
        self.out = open(os.path.join(logs_dir, f"{name}.stdout"), "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.err)
        CHILDREN.append(self.proc)
        self.closed_by_us = False
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for raw in self.proc.stdout:
            t = mono()
            text = raw.decode(errors="replace").rstrip("\n")
            with LOCK:
                self.lines.append((t, text))
            self.out.write(f"{t:.3f} {text}\n")
            self.out.flush()
        rc = self.proc.wait()
        t = mono()
        self.err.seek(0)
        err = [l.strip() for l in self.err.read().splitlines() if l.strip()]
        with LOCK:
            self.end = (t, rc, "ended by this script" if self.closed_by_us else "ended", err[-1] if err else "")

    def feed(self, stop):
        n = 0
        while not stop.is_set() and self.end is None:
            n += 1
            try:
                self.proc.stdin.write(f"echo tick {n}\n".encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return
            with LOCK:
                self.sent.append((mono(), n))
            stop.wait(1)

    def close(self):
        if self.end is None:
            self.closed_by_us = True
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        deadline = mono() + 5
        while self.end is None and mono() < deadline:
            time.sleep(0.05)


# ---------------------------------------------------------------- run

def run(o):
    os.makedirs(o.logs, exist_ok=True)
    api = Api(o.apiserver, o.api_ca, o.admin_cert, o.admin_key)
    kubectl = [o.kubectl, f"--kubeconfig={o.kubeconfig}"]
    stop, stop_probes = threading.Event(), threading.Event()
    pods, ds_status = Pods(o.daemonset), DaemonSetStatus()
    node = Node(pods, o.pod_logs, o.namespace, o.daemonset, o.logs)
    threads = [
        threading.Thread(target=api.watch, args=(f"/api/v1/namespaces/{o.namespace}/pods", pods.on_object, stop), daemon=True),
        threading.Thread(target=api.watch, args=(f"/apis/apps/v1/namespaces/{o.namespace}/daemonsets?fieldSelector=metadata.name%3D{o.daemonset}",
                                                 ds_status.on_object, stop), daemon=True),
        threading.Thread(target=node.run, args=(stop,), daemon=True),
    ]
    probers = [
        Prober("direct", 0.2, direct_probe(o.node_url, o.kubelet_ca, o.node_cert, o.node_key)),
        Prober("apiserver", 0.5, apiserver_probe(api, o.node)),
    ]
    threads += [threading.Thread(target=p.run, args=(stop_probes,), daemon=True) for p in probers]
    for t in threads:
        t.start()

    ns, pod = o.ticker.split("/")
    logs = Session("logs-f", kubectl + ["logs", "-f", "-n", ns, pod], o.logs)
    exe = Session("exec", kubectl + ["exec", "-i", "-n", ns, pod, "--", "sh"], o.logs, stdin=True)
    feeder_stop = threading.Event()
    threading.Thread(target=exe.feed, args=(feeder_stop,), daemon=True).start()
    sessions = [logs, exe]

    # Both sessions deliver, the old pod is ready and its process the only one: then restart.
    deadline = mono() + 60
    while True:
        with LOCK:
            ready = [p for p in pods.pods.values() if p["state"].get("ready")]
        fresh = all(s.lines and s.lines[-1][0] > mono() - 2.5 and len(s.lines) >= 3 for s in sessions)
        if fresh and len(ready) == 1 and len(node.procs) == 1:
            break
        for s in sessions:
            if s.end is not None:
                sys.exit(f"measure.py: {s.name} ended before the restart (exit {s.end[1]}: {s.end[3]})")
        if mono() > deadline:
            sys.exit(f"measure.py: not ready to restart after 60 s: sessions {[len(s.lines) for s in sessions]} lines, "
                     f"{len(ready)} ready pods, {len(node.procs)} proxy processes")
        time.sleep(0.2)

    t0, wall0 = mono(), time.time()
    with LOCK:
        pods.t0 = t0
    twice = o.second_restart is not None

    def restart(what):
        event("mark", f"{what} issued")
        r = subprocess.run(kubectl + ["--request-timeout=30s", "rollout", "restart", f"daemonset/{o.daemonset}",
                                      "-n", o.namespace], capture_output=True, text=True, timeout=60)
        event("mark", f"{what} returned (exit {r.returncode})")
        if r.returncode != 0:
            sys.exit(f"measure.py: {what} failed: {r.stderr.strip()}")

    def rollout_status(name, what):
        """`kubectl rollout status` from now on: (process, [(t, exit code)] once it ends, output file)."""
        out = open(os.path.join(o.logs, f"{name}.out"), "w+")
        proc = subprocess.Popen(kubectl + ["rollout", "status", f"daemonset/{o.daemonset}", "-n", o.namespace,
                                           f"--timeout={int(o.watch + o.settle)}s"], stdout=out, stderr=subprocess.STDOUT)
        CHILDREN.append(proc)
        ended = []

        def wait():
            rc = proc.wait()
            ended.append((mono(), rc))
            event("mark", f"{what} returned (exit {rc})")
        threading.Thread(target=wait, daemon=True).start()
        return proc, ended, out

    restart("`kubectl rollout restart`")
    status, status_end, status_out = rollout_status(
        "rollout-status", "`kubectl rollout status`" + (" (first rollout)" if twice else ""))

    # --second-restart: once the first rollout is over (its `rollout status` returned, the new pod B
    # ready), a second pair of sessions, which B takes; at --second-restart seconds after the
    # first, a second restart (its new pod is C).
    second = {"phase": "rollout" if twice else None, "t1": None, "pair": [], "opened": None, "delivering": None,
              "status": None, "status_end": [], "status_out": None}

    def step_second():
        now = mono()
        if second["phase"] == "rollout":
            with LOCK:
                b_ready = any(p["role"] == "B" and p["state"].get("ready") for p in pods.pods.values())
            if status_end and b_ready:
                second["opened"] = now
                event("mark", "the first rollout is over: second pair of sessions opened (logs-f-2, exec-2)")
                pair = [Session("logs-f-2", kubectl + ["logs", "-f", "-n", ns, pod], o.logs),
                        Session("exec-2", kubectl + ["exec", "-i", "-n", ns, pod, "--", "sh"], o.logs, stdin=True)]
                threading.Thread(target=pair[1].feed, args=(feeder_stop,), daemon=True).start()
                second["pair"] = pair
                sessions.extend(pair)
                second["phase"] = "pair"
        elif second["phase"] == "pair":
            for s in second["pair"]:
                if s.end is not None:
                    sys.exit(f"measure.py: {s.name} ended before the second restart (exit {s.end[1]}: {s.end[3]})")
            if all(len(s.lines) >= 3 for s in second["pair"]):
                second["delivering"] = now
                event("mark", "second pair of sessions delivering")
                second["phase"] = "wait"
        if second["phase"] in ("rollout", "pair") and now - t0 >= o.second_restart:
            sys.exit(f"measure.py: --second-restart {o.second_restart:.0f}: not ready for the second restart at "
                     f"+{now - t0:.0f} s: first rollout status {'returned' if status_end else 'not returned'}, "
                     f"second pair {[len(s.lines) for s in second['pair']] or 'not opened'} lines")
        if second["phase"] == "wait" and now - t0 >= o.second_restart:
            with LOCK:
                pods.t1 = now
            second["t1"] = now
            restart("second `kubectl rollout restart`")
            second["status"], second["status_end"], second["status_out"] = rollout_status(
                "rollout-status-2", "`kubectl rollout status` (second rollout)")
            second["phase"] = "restarted"

    def replaced(p):
        if not twice:
            return p["old"]
        return p["role"] == "A" or (p["role"] == "B" and second["t1"] is not None)

    def old_left():
        with LOCK:
            old_uids = {u for u, p in pods.pods.items() if replaced(p)}
            old_pods = [p for p in pods.pods.values() if replaced(p) and "gone" not in p["times"]]
        return old_pods, [pid for pid, uid in node.procs.items() if uid in old_uids]

    def done():
        old_pods, old_procs = old_left()
        return (status_end and (not twice or second["status_end"]) and not old_pods and not old_procs
                and all(s.end for s in sessions))

    next_note = t0 + 10
    while mono() - t0 < o.watch and not done():
        if twice:
            step_second()
        if mono() > next_note:
            next_note += 10
            old_pods, old_procs = old_left()
            rs = "returned" if status_end else "waiting"
            if twice and second["status"] is not None:
                rs += "/" + ("returned" if second["status_end"] else "waiting")
            say(f"+{mono() - t0:.0f} s: sessions {'/'.join('open' if s.end is None else 'ended' for s in sessions)}, "
                f"rollout status {rs}, old pods {len(old_pods)}, old processes {len(old_procs)}")
        time.sleep(0.1)
    bound_hit = mono() - t0 >= o.watch
    if twice and second["t1"] is None:
        sys.exit("measure.py: every session ended and the first rollout was over before the second restart")
    if bound_hit:
        still = [s for s in sessions if s.end is None]
        if still:
            event("mark", f"--watch bound reached: this script ends {', '.join(s.name for s in still)}")
        feeder_stop.set()
        for s in still:
            s.close()
        settle_end = mono() + o.settle
        while mono() < settle_end and not done():
            time.sleep(0.1)
    feeder_stop.set()
    for s in sessions:
        s.close()
    time.sleep(1)  # the last pod and process changes
    stop_probes.set()
    stop.set()
    for proc, ended in [(status, status_end), (second["status"], second["status_end"])]:
        if proc is not None and not ended:
            proc.terminate()
            proc.wait()
    time.sleep(0.5)

    with LOCK:
        ev = list(EVENTS)
        pod_list = list(pods.pods.values())
        log_lines = list(LOG_LINES)
        audit = list(AUDIT)
        series = list(pods.series)
    conns = list(node.conns.values())

    def status_result(ended, out):
        if not ended:
            return None
        out.seek(0)
        return {"t": ended[0][0] - t0, "rc": ended[0][1], "output": out.read().strip().splitlines()[-3:]}

    result = {
        "t0_wall": wall0,
        "watch": o.watch, "settle": o.settle, "bound_hit": bound_hit,
        "events": [(t - t0, k, text, extra) for t, k, text, extra in ev],
        "pods": [{**p, "seen": p["seen"] - t0, "times": {k: v - t0 for k, v in p["times"].items()}} for p in pod_list],
        "processes": [(t - t0, n) for t, n in node.counts],
        "final_processes": {str(pid): uid for pid, uid in node.procs.items()},
        "probes": {p.name: {"interval": p.interval, "results": [(t - t0, r) for t, r in p.results]} for p in probers},
        "sessions": {s.name: {"lines": [(t - t0, x) for t, x in s.lines], "sent": [(t - t0, n) for t, n in s.sent],
                              "end": None if s.end is None else (s.end[0] - t0, s.end[1], s.end[2], s.end[3]),
                              "argv": s.argv[2:], "start": s.start - t0} for s in sessions},
        "rollout_status": status_result(status_end, status_out),
        "log_lines": [(w - wall0, pod, msg) for w, pod, msg in sorted(log_lines)],
        "kubelet_lines": [(w - wall0, text) for w, text in
                          kubelet_lines(o.kubelet_log, f"{o.namespace}/{o.daemonset}-", time.gmtime(wall0).tm_year)],
        "pod_series": [(t - t0, n, draining) for t, n, draining in series],
        "connections": [{**c, "first": c["first"] - t0, "last": c["last"] - t0} for c in conns],
        "audit": [(w - wall0, pod, stage, uri, aid, code, None if rec is None else rec - wall0)
                  for w, pod, stage, uri, aid, code, rec in sorted(audit, key=lambda a: a[0])],
    }
    if twice:
        result["second"] = {
            "asked": o.second_restart, "t": second["t1"] - t0,
            "pair_opened": second["opened"] - t0 if second["opened"] is not None else None,
            "pair_delivering": second["delivering"] - t0 if second["delivering"] is not None else None,
            "rollout_status": status_result(second["status_end"], second["status_out"]),
        }
    json.dump(result, open(o.result, "w"), indent=1)

# ---------------------------------------------------------------- report

def fmt(t):
    return f"{t:+.1f} s"


def probe_rows(r, p):
    """A summary row for each kind of request sent all along."""
    for name, pr in r["probes"].items():
        res = [x for t, x in pr["results"] if t >= 0]
        bad = [(t, x) for t, x in pr["results"] if t >= 0 and x != "ok"]
        kinds = {}
        for _, x in bad:
            kinds[x] = kinds.get(x, 0) + 1
        what = ("new TCP+TLS connection to the node's address, `GET /healthz`" if name == "direct"
                else "`GET /api/v1/nodes/NODE/proxy/healthz` through the API server")
        p(f"| requests: {what}, every {pr['interval']} s | {len(bad)} of {len(res)} failed"
          + (f" ({'; '.join(f'{n}× {k}' for k, n in kinds.items())}; {fmt(bad[0][0])} to {fmt(bad[-1][0])})" if bad else "")
          + " |")


def timeline(r, p, limit=40, more=(), rename=lambda text: text):
    """The timeline: every change seen from the restart on; MORE rows (t, text) are added, and
    RENAME applies to each row's text."""
    events = r["events"]
    sessions = r["sessions"]
    # The timeline: every change seen from the restart on, by the watches, /proc, the sessions,
    # the probes, the proxies' and the kubelet's logs. Before the restart, one row: what ran.
    # Processes are named by their pod here, at the end (a process is often seen before the pod
    # watch has reported its pod's UID).
    names = {pod["uid"]: pod["name"] for pod in r["pods"]}
    rows = []
    before_pods = [pod["name"] + (" (ready)" if pod["times"].get("ready", 1) < 0 or pod["state"].get("ready") else "")
                   for pod in r["pods"] if pod["old"]]
    before_procs = [f"{e[3]['pid']} of {names.get(e[3]['uid'], 'pod ' + e[3]['uid'][:8])}"
                    for e in events if e[1] == "proc+" and e[0] < 0]
    rows.append((None, f"before the restart: pods {', '.join(before_pods) or 'none'}; proxy processes {', '.join(before_procs) or 'none'}"))
    for t, kind, text, extra in events:
        if t < 0:
            continue
        if kind in ("proc+", "proc-"):
            text = (f"proxy process {extra['pid']} ({names.get(extra['uid'], 'pod ' + extra['uid'][:8])}) "
                    + ("running" if kind == "proc+" else "exited"))
        rows.append((t, text))
    for t, text in r.get("kubelet_lines", []):
        if t >= 0:
            rows.append((t, text))
    for name, s in sessions.items():
        after = [t for t, _ in s["lines"] if t >= 0]
        if after:
            rows.append((after[0], f"{name}: first line" + (" after the restart" if s.get("start", -1) < 0 else "")))
            rows.append((after[-1], f"{name}: last line"))
        if s["end"]:
            rows.append((s["end"][0], f"{name}: {s['end'][2]} (kubectl exit {s['end'][1]})"
                         + (f": {s['end'][3][:140]}" if s["end"][3] else "")))
    for name, pr in r["probes"].items():
        run_start = prev = None
        count = 0
        cause = None
        for t, x in pr["results"] + [(1e9, "ok")]:
            if x != "ok" and t >= 0:
                if run_start is None:
                    run_start, count, cause = t, 0, x
                count += 1
                prev = t
            elif run_start is not None:
                rows.append((run_start, f"{name} requests: {count} failed until {fmt(prev)} ({cause})"))
                run_start = None
    # The proxies' own messages, at most LIMIT a pod (the rest are in the logs the run kept).
    shown = {}
    for t, pod, msg in r["log_lines"]:
        if t >= 0:
            shown[pod] = shown.get(pod, 0) + 1
            if shown[pod] <= limit:
                rows.append((t, f"log of {pod}: {msg}"))
            elif shown[pod] == limit + 1:
                rows.append((t, f"log of {pod}: more messages from here on, not shown"))
    rows += list(more)
    rows.sort(key=lambda x: -1e9 if x[0] is None else x[0])
    p("| t | event |")
    p("|---:|---|")
    for t, text in rows:
        p(f"| {'before' if t is None else fmt(t)} | {rename(text).replace('|', '/')} |")
    p("")


# Messages of the proxy's log that mark a step of a handover and of a drain (their beginnings).
GAVE = "handed the listening sockets over"
TOOK = "listening sockets handed over"
DRAIN = "a successor serves on the handed-over sockets"
TOLD = "the process this one handed over to drains sessions of its own now"
TELLS = "told the proxy this one took over from to close"
CLOSING = "closing the sessions still open now"
ALL_ENDED = "every session has ended"
PAIRS = [("logs-f", 1, "`kubectl logs -f`"), ("exec", 1, "`kubectl exec -i … -- sh`"),
         ("logs-f-2", 2, "`kubectl logs -f`"), ("exec-2", 2, "`kubectl exec -i … -- sh`")]


def report_twice(r, p):
    """The report of a run with --second-restart: two rollouts in a row, pods A (before), B (the
    first rollout's), C (the second's); session pair 1 opened on A, pair 2 on B."""
    events, sessions, watch = r["events"], r["sessions"], r["watch"]
    sec = r["second"]
    t1 = sec["t"]
    pods = sorted(r["pods"], key=lambda x: x["seen"])
    role = {}  # pod name -> A, B, C (A2, … if a role had several pods)
    for letter in "ABC":
        of = [pod for pod in pods if pod["role"] == letter]
        for i, pod in enumerate(of):
            role[pod["name"]] = letter if len(of) == 1 else f"{letter}{i + 1}"
    by_uid = {pod["uid"]: pod for pod in pods}
    logs = r["log_lines"]

    def both(t):
        """A time on both clocks once the second restart is issued."""
        if t is None:
            return "—"
        return fmt(t) + (f" (2nd {fmt(t - t1)})" if t >= t1 else "")

    def log_at(pod, prefix):
        return next(((t, m) for t, name, m in logs if name == pod["name"] and m.startswith(prefix)), (None, None))

    def kubelet_at(pod, prefix):
        return next((t for t, text in r["kubelet_lines"] if text.startswith(f"kubelet, {pod['name']}: {prefix}")), None)

    def proc_exit(pod):
        return next((t for t, kind, _, extra in events if kind == "proc-" and extra.get("uid") == pod["uid"]), None)

    def gone_exit(pod):
        """The first sign of the process's end: /proc (sampled every 0.25 s) or the pod's status."""
        seen = [t for t in (proc_exit(pod), pod["times"].get("exited")) if t is not None]
        return min(seen) if seen else None

    def pids(pod):
        return sorted({extra["pid"] for _, kind, _, extra in events if kind == "proc+" and extra.get("uid") == pod["uid"]})

    # When each pod's process drained sessions after its grace period (the handover's drain): from
    # its log's DRAIN to its CLOSING or ALL_ENDED (its sessions' end), and to its process's exit.
    # These are the "draining processes" the feature bounds.
    drains = []
    for pod in pods:
        t, _ = log_at(pod, DRAIN)
        if t is not None:
            ends = [x for x in (log_at(pod, CLOSING)[0], log_at(pod, ALL_ENDED)[0]) if x is not None]
            drains.append((t, min(ends) if ends else None, gone_exit(pod), pod))

    def count_series(intervals):
        points = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals if b is not None])
        n, seq, top = 0, [], 0
        for t, d in points:
            n += d
            top = max(top, n)
            seq.append(f"{n} at {fmt(t)}")
        return seq, top

    # ------------------------------------------------------------ summary
    p(f"t = 0: the first `kubectl rollout restart daemonset/…`; the second at {fmt(t1)} (asked: "
      f"+{sec['asked']:.0f} s), written \"2nd +x s\" from then on. Pod A served before, B is the first rollout's "
      "new pod, C the second's.\n")
    p("| | Result |")
    p("|---|---|")
    rs = r["rollout_status"]
    p("| `kubectl rollout status`, first rollout | " + (f"**returned at {fmt(rs['t'])}** (exit {rs['rc']}: "
      f"{rs['output'][-1][:160] if rs['output'] else 'no output'})" if rs else "had not returned") + " |")
    rs2 = sec["rollout_status"]
    p("| `kubectl rollout status`, second rollout (started with the second restart) | "
      + (f"**returned at {both(rs2['t'])}** (exit {rs2['rc']}: {rs2['output'][-1][:160] if rs2['output'] else 'no output'})"
         if rs2 else "had not returned") + " |")
    probe_rows(r, p)
    procs = r["processes"]
    before_n = [n for t, n in procs if t < 0]
    p(f"| proxy processes on the node | {before_n[-1] if before_n else '?'} before; "
      f"{', '.join(f'{n} at {both(t)}' for t, n in procs if t >= 0) or 'no change'}; "
      f"at most {max(n for _, n in procs)} |")
    series = r["pod_series"]
    before = [x for x in series if x[0] < 0]
    b_pods, b_drain = (before[-1][1], before[-1][2]) if before else ("?", "?")
    seq, last = [], None
    for t, n, _ in series:
        if t >= 0 and n != last:
            seq.append(f"{n} at {both(t)}")
        last = n
    p(f"| the DaemonSet's pods (`app.kubernetes.io/name` label: released ones included) | {b_pods} before; "
      f"{', '.join(seq) or 'no change'}; at most {max(x[1] for x in series)} |")
    seq, last = [], None
    for t, _, d in series:
        if t >= 0 and d != last:
            seq.append(f"{d} at {both(t)}")
        last = d
    p(f"| pods labelled `kubelet-auth-proxy/draining=true` (from the stop: grace period, then the session drain) "
      f"| {b_drain} before; {', '.join(seq) or 'no change'}; at most {max(x[2] for x in series)} |")
    spans = "; ".join(f"{role[pod['name']]} from {both(a)} to " + (both(b) if b is not None else "the end")
                      + (f" (process gone {both(x)})" if x is not None else "") for a, b, x, pod in drains)
    _, top = count_series([(a, b) for a, b, _, _ in drains])
    _, top_exit = count_series([(a, x) for a, _, x, _ in drains])
    overlaps = []
    for i, (a1, b1, x1, pod1) in enumerate(drains):
        for a2, b2, x2, pod2 in drains[i + 1:]:
            def overlap(e1, e2):
                e1 = 1e9 if e1 is None else e1
                e2 = 1e9 if e2 is None else e2
                return min(e1, e2) - max(a1, a2)
            by_log, by_exit = overlap(b1, b2), overlap(x1, x2)
            if by_exit > 0:
                overlaps.append(f"{role[pod1['name']]} and {role[pod2['name']]} both draining for "
                                f"{max(by_log, 0) * 1000:.1f} ms by their logs (the one's start to the other's "
                                f"closing), at most {by_exit * 1000:.0f} ms until the process was gone (/proc, sampled "
                                f"every 0.25 s, or the pod's status, whichever showed it first)")
    p(f"| processes draining sessions after a handover (from `{DRAIN}…` to `{CLOSING}…` or `{ALL_ENDED}…`) | "
      f"{spans or 'none'}; at most {top} at once by the logs, {top_exit} until the processes were gone"
      + (f": {'; '.join(overlaps)}" if overlaps else "") + " |")
    took = [f"{role.get(pod, pod)} at {both(t)}" for t, pod, m in logs if m.startswith(TOOK)]
    gave = [f"{role.get(pod, pod)} at {both(t)}" for t, pod, m in logs if m.startswith(GAVE)]
    p(f"| surge handovers | sockets taken: {', '.join(took) or 'none seen'}; given: {', '.join(gave) or 'none seen'} |")
    told = [f"{role.get(pod, pod)} at {both(t)}" for t, pod, m in logs if m.startswith(TELLS)]
    heard = [f"{role.get(pod, pod)} at {both(t)}" for t, pod, m in logs if m.startswith(TOLD)]
    p(f"| the handover line: the successor, draining in turn, tells its predecessor to close | told: "
      f"{', '.join(told) or 'none seen'}; told to close: {', '.join(heard) or 'none seen'} |")
    p("")

    # ------------------------------------------------------------ sessions
    audit = r.get("audit", [])

    def taken_by(name, s):
        """The pod whose proxy logged the session's request (its audit event), received closest after
        the session started."""
        kind = "/exec/" if name.startswith("exec") else "/containerLogs/"
        found = [a for a in audit if a[3].startswith(kind) and a[6] is not None and a[6] >= s["start"] - 1.0]
        if not found:
            return "no audit event seen", None
        a = min(found, key=lambda a: a[6])
        done = [x for x in audit if x[4] == a[4] and x[2] == "ResponseComplete" and x[0] > a[0] + 1]
        return (f"{role.get(a[1], a[1])} (`{a[1]}`: {a[2]} {a[5]} at {fmt(a[6])})"
                + (f"; its ResponseComplete at {both(done[0][0])}" if done else "")), a[1]

    p("| session | opened | taken by (the proxy's audit event) | after the 1st restart | after the 2nd restart | ended |")
    p("|---|---|---|---|---|---|")
    for name, pair, what in PAIRS:
        s = sessions.get(name)
        if s is None:
            continue
        by, _ = taken_by(name, s)
        lines = s["lines"]
        after1 = [t for t, _ in lines if t >= 0]
        after2 = [t for t, _ in lines if t >= t1]
        start = max(0.0, s["start"])
        gaps, prev = [], start
        for t in after1:
            gaps.append(t - prev)
            prev = t
        end = s["end"]
        if end is None or end[2] == "ended by this script":
            ended = f"**still open at +{watch:.0f} s** (then ended by this script)"
            end_t = None
        else:
            end_t = end[0]
            ended = f"**ended at {both(end_t)}**, kubectl exit {end[1]}" + (f": `{end[3][:160]}`" if end[3] else "")
        extra = ""
        if s["sent"]:
            sent_at = {n: t for t, n in s["sent"]}
            answered = {int(x.split()[-1]): t for t, x in lines if re.fullmatch(r"tick \d+", x)}
            first = min(answered.values(), default=0.0)
            sent = [n for n, t in sent_at.items() if t >= 0]
            delays = [answered[n] - sent_at[n] for n in sent if n in answered and sent_at[n] >= first]
            extra = (f"; {len(sent)} ticks sent, {sum(1 for n in sent if n in answered)} answered"
                     + (f", slowest {max(delays) * 1000:.0f} ms (after its first answer)" if delays else ""))
        last = (f"last line {both(after1[-1])}, largest gap {max(gaps):.1f} s" if after1 else "no line")
        lasted1 = f"{(end_t if end_t is not None else watch):.1f} s" + ("" if end_t is not None else "+")
        lasted2 = (f"{end_t - t1:.1f} s" if end_t is not None else f"{watch - t1:.1f} s+") if (end_t or watch) >= t1 else "ended before it"
        p(f"| pair {pair}: {what} | {fmt(s['start'])} | {by} | {len(after1)} lines, lasted {lasted1} | "
          f"{len(after2)} lines, lasted {lasted2} | {ended}; {last}{extra} |")
    p("")

    # ------------------------------------------------------------ the pods, step by step
    p("| | " + " | ".join(f"pod {role[pod['name']]} `{pod['name']}`" for pod in pods) + " |")
    p("|---|" + "---|" * len(pods))

    def row(label, values):
        p(f"| {label} | " + " | ".join(values) + " |")

    row("proxy process (pid)", [", ".join(map(str, pids(pod))) or "—" for pod in pods])
    row("created", ["before t = 0" if pod["old"] else both(pod["seen"]) for pod in pods])
    row("took the sockets (`listening sockets handed over`)", [both(log_at(pod, TOOK)[0]) for pod in pods])
    row("ready", ["before t = 0" if pod["old"] and pod["times"].get("ready", -1) < 0 else both(pod["times"].get("ready"))
                  for pod in pods])
    row("gave the sockets to its successor", [both(log_at(pod, GAVE)[0]) for pod in pods])
    row("deletion asked; kubelet's SIGTERM", [f"{both(pod['times'].get('deleting'))}; {both(kubelet_at(pod, 'stopping container'))}"
                                              for pod in pods])
    row("draining label", [both(pod["times"].get("labelled")) for pod in pods])
    row("released by the DaemonSet", [both(pod["times"].get("released")) for pod in pods])

    def with_msg(pod, prefix):
        t, m = log_at(pod, prefix)
        if t is None:
            return "—"
        n = re.search(r"\bopen=(\d+)", m or "")
        return both(t) + (f", open={n.group(1)}" if n else "")
    row(f"grace period over, drains its sessions (`{DRAIN[:40]}…`)", [with_msg(pod, DRAIN) for pod in pods])
    row("told its predecessor to close (`told the proxy this one took over from…`)", [with_msg(pod, TELLS) for pod in pods])
    row("told by its successor (`the process this one handed over to drains…`)", [with_msg(pod, TOLD) for pod in pods])
    row("closed its sessions / all ended", [f"{both(log_at(pod, CLOSING)[0])} / {both(log_at(pod, ALL_ENDED)[0])}"
                                            for pod in pods])
    row("process exited", [both(proc_exit(pod)) for pod in pods])
    row("container exited", [both(pod["times"].get("exited")) + (f" ({pod['exit']})" if pod.get("exit") else "")
                             for pod in pods])
    row("gone", [both(pod["times"].get("gone")) if "gone" in pod["times"]
                 else f"still there at the end ({pod['state'].get('container', '?')})" for pod in pods])
    p("")

    # ------------------------------------------------------------ connections by process
    held = [c for c in r.get("connections", []) if c["last"] - c["first"] >= 10]
    if held:
        p("Client connections (accepted on :10250) each proxy process held for 10 s or more, from /proc "
          "(the socket in the process's descriptors; first and last seen):\n")
        for pod in pods:
            mine = sorted((c for c in held if c["uid"] == pod["uid"]), key=lambda c: c["first"])
            if mine:
                sessions_taken = any(a[1] == pod["name"] for a in audit)
                p(f"- {role[pod['name']]} (pid {', '.join(map(str, pids(pod)))}): "
                  + "; ".join(f"{c['remote']} {both(c['first'])} to {both(c['last'])}" for c in mine)
                  + ("" if sessions_taken else " (no session request in its audit events: a kept-alive connection "
                     "of requests, such as the API server's for `nodes/NODE/proxy/healthz`)"))
        p("")

    # ------------------------------------------------------------ timeline
    more = []
    for a in audit:
        if a[0] >= 0:
            more.append((a[0], f"audit of {a[1]}: {a[2]} {a[5]} {a[3][:48]}"))

    def rename(text):
        for name, letter in role.items():
            text = text.replace(name, f"{name} ({letter})")
        return text
    timeline(r, p, limit=60, more=more, rename=rename)


def report(result_path, context_path):
    r = json.load(open(result_path))
    c = json.load(open(context_path))
    out = []
    p = out.append
    twice = "second" in r
    p(f"### {'Two rollout restarts of the DaemonSet in a row' if twice else 'A rollout restart of the DaemonSet'} "
      f"on a real cluster: {c['label']}\n")
    p(f"Generated by `{c['invocation']}`, {c['date']}, commit {c['commit']}. {c['setup']}\n")
    p(f"Binary: {c['binary']}. Image: `{c['image']}` ({c['digest'][:19]}…). Manifests: {c['manifests']}. "
      + (f"**Removed for this binary (--legacy-flags), which does not know them:** "
         f"{', '.join(f'`{text}` ({where})' for text, where in c['stripped'])}."
         if c["stripped"] else "No flag removed: the binary knows every flag of the manifests.")
      + f" Update strategy: `{json.dumps(c['updateStrategy'], separators=(',', ':'))}`; selector "
      f"`{json.dumps(c['selector'], separators=(',', ':'))}`; terminationGracePeriodSeconds "
      f"{c['terminationGracePeriodSeconds']}; the proxy's settings for a rollout: `{'`, `'.join(c['settings'])}`.\n")

    if twice:
        report_twice(r, p)
        print("\n".join(out))
        return
    events = r["events"]
    sessions = r["sessions"]
    watch = r["watch"]

    def session_row(name, what):
        s = sessions[name]
        after = [(t, x) for t, x in s["lines"] if t >= 0]
        before = len(s["lines"]) - len(after)
        gaps, prev = [], 0.0
        for t, _ in after:
            gaps.append(t - prev)
            prev = t
        last = f"last line at {fmt(after[-1][0])}" if after else "no line after the restart"
        end = s["end"]
        if end is None or end[2] == "ended by this script":
            ended = f"**still open at +{watch:.0f} s** (then ended by this script)"
        else:
            ended = f"**ended at {fmt(end[0])}**, kubectl exit {end[1]}" + (f": `{end[3][:160]}`" if end[3] else "")
        extra = ""
        if s["sent"]:
            # Each tick's answer against its sending: a session that stalls without ending shows
            # as a slow answer.
            sent_at = {n: t for t, n in s["sent"]}
            answered = {int(x.split()[-1]): t for t, x in after if re.fullmatch(r"tick \d+", x)}
            sent_after = [n for n, t in sent_at.items() if t >= 0]
            delays = [answered[n] - sent_at[n] for n in sent_after if n in answered]
            extra = (f"; {len(sent_after)} ticks sent after the restart, {len(delays)} answered"
                     + (f", slowest answer {max(delays) * 1000:.0f} ms" if delays else ""))
        p(f"| {what} | {len(after)} lines after the restart ({before} before), {last}, largest gap "
          f"{max(gaps):.1f} s{extra}; {ended} |" if gaps else f"| {what} | {last}; {ended} |")

    p("| | Result (t = 0: `kubectl rollout restart daemonset/…`) |")
    p("|---|---|")
    session_row("logs-f", "`kubectl logs -f` (a line a second)")
    session_row("exec", "`kubectl exec -i … -- sh` (`echo tick N` a second)")
    rs = r["rollout_status"]
    p(f"| `kubectl rollout status` | " + (f"**returned at {fmt(rs['t'])}** (exit {rs['rc']}: {rs['output'][-1][:160] if rs['output'] else 'no output'})"
                                         if rs else f"had not returned after {watch + r['settle']:.0f} s") + " |")
    probe_rows(r, p)
    procs = r["processes"]
    before_n = [n for t, n in procs if t < 0]
    changes = ", ".join(f"{n} at {fmt(t)}" for t, n in procs if t >= 0)
    p(f"| proxy processes on the node | {before_n[-1] if before_n else '?'} before; {changes or 'no change'} |")
    n, seq = 0, []
    for t, kind, _, _ in events:
        if kind in ("pod+", "pod-"):
            n += 1 if kind == "pod+" else -1
            if t >= 0:
                seq.append(f"{n} at {fmt(t)}")
    p(f"| the DaemonSet's pods (released ones included) | {sum(1 for pod in r['pods'] if pod['old'])} before; "
      f"{', '.join(seq) or 'no change'} |")
    for pod in sorted(r["pods"], key=lambda x: x["seen"]):
        tm = pod["times"]
        role = "old pod" if pod["old"] else "new pod"
        parts = [] if pod["old"] else [f"created {fmt(pod['seen'])}"]
        for key, label in [("ready", "ready"), ("labelled", "draining label"), ("deleting", "deletion asked"),
                           ("unready", "not ready"), ("released", "released by the DaemonSet"),
                           ("exited", "container exited"), ("gone", "gone")]:
            if key in tm and (key != "ready" or not pod["old"] or tm[key] >= 0):
                parts.append(f"{label} {fmt(tm[key])}" + (f" ({pod.get('exit')})" if key == "exited" and pod.get("exit") else ""))
        if "gone" not in tm:
            parts.append(f"still there at the end ({pod['state'].get('container', '?')}"
                         f"{', deleting' if pod['state'].get('deleting') else ''})")
        p(f"| {role} `{pod['name']}` | {'; '.join(parts)} |")
    # The surge handover, as the two processes log it: the new one took the sockets, the old one
    # gave them.
    took = [f"{pod} at {fmt(t)}" for t, pod, m in r["log_lines"] if m.startswith("listening sockets handed over")]
    gave = [f"{pod} at {fmt(t)}" for t, pod, m in r["log_lines"] if m.startswith("handed the listening sockets over")]
    p("| surge handover | " + (f"yes: \"listening sockets handed over\" ({', '.join(took)}), \"handed the listening "
                              f"sockets over\" ({', '.join(gave)})" if took and gave else
                              f"**not seen in the proxy logs** (taken: {took or 'no'}; given: {gave or 'no'})") + " |")
    p("")

    timeline(r, p)
    print("\n".join(out))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        report(sys.argv[2], sys.argv[3])
        return
    a = argparse.ArgumentParser()
    a.add_argument("cmd", choices=["run"])
    a.add_argument("result")
    for name in ("kubectl", "kubeconfig", "apiserver", "api-ca", "admin-cert", "admin-key", "node", "node-url",
                 "kubelet-ca", "node-cert", "node-key", "namespace", "daemonset", "pod-logs", "kubelet-log", "ticker",
                 "logs"):
        a.add_argument(f"--{name}", required=True)
    a.add_argument("--watch", type=float, required=True)
    a.add_argument("--settle", type=float, required=True)
    a.add_argument("--second-restart", type=float, default=None)
    try:
        run(a.parse_args())
    finally:
        for child in CHILDREN:
            if child.poll() is None:
                child.kill()


if __name__ == "__main__":
    main()
