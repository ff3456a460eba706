#!/usr/bin/env python3
"""bench/rollout.d/render.py: the repository's manifests, adapted to the test kit's cluster.

    render.py IN.json OUT.json REPORT.json --image NAME --busybox NAME --kubelet-root DIR
              --handover-dir DIR --apiserver HOST:PORT --binary BINARY [--legacy-flags]

IN.json is what the repository's manifests render to (`kubectl kustomize`, then turned into JSON
by `kubectl create --dry-run=client -o json`: one JSON object after the other, or a List). Only
what a node of the kit differs in is changed, so that the rollout measured is the one the
manifests describe:

- images: the proxy container runs NAME (built from the binary under test; nothing can be pulled
  here), busybox init containers the kit's busybox; every pull policy Never, so a missing image
  fails at once instead of hanging on a registry;
- hostPaths: the kubelet's files under /var/lib/kubelet/ are under the kit kubelet's root
  directory; the handover directory (/run/kubelet-auth-proxy on a node) is a directory of this
  run, so runs never share one with each other or with the host;
- the API server: pods cannot reach the `kubernetes` Service here (no kube-proxy), so the proxy
  container is told the API server's real address in KUBERNETES_SERVICE_HOST/PORT, which a
  container's own env takes before the kubelet's service variables (the host network is the kit's
  network namespace, where the API server listens);
- flags: every `--flag` of the proxy container the binary does not know (its --help lists the
  ones it does), and every key of its configuration file (a ConfigMap holding a
  ProxyConfiguration; the keys are the flags in camelCase) it does not know, is removed with
  --legacy-flags, and is an error without it (an old binary given new manifests would exit at
  start).

REPORT.json says what was changed, and which ConfigMaps and Secrets the DaemonSet mounts that the
manifests do not contain (the caller creates them, or finds them on the API server).
"""
import argparse
import json
import re
import subprocess
import sys

PROXY_IMAGE_WORD = "kubelet-auth-proxy"


def known_flags(binary):
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", help_text))


def strip_unknown(args, known):
    """(kept args, removed items): drops each `--flag[=value]` whose flag is unknown, and the value
    after a bare `--flag` when that value is not itself a flag."""
    kept, removed, i = [], [], 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if arg.startswith("--") and name not in known:
            removed.append(arg)
            if "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("-"):
                removed.append(args[i + 1])
                i += 1
        else:
            kept.append(arg)
        i += 1
    return kept, removed


def json_stream(text):
    """The objects of TEXT: one JSON document after the other (kubectl prints one per object)."""
    decoder, i = json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return
        obj, i = decoder.raw_decode(text, i)
        yield obj


def config_key_flag(key):
    """The flag of a configuration file key: sessionDrainTimeout -> --session-drain-timeout (the
    file's keys are the flags' names in camelCase)."""
    return "--" + re.sub(r"[A-Z]", lambda m: "-" + m.group(0).lower(), key)


def strip_unknown_keys(text, known):
    """(text without the top-level keys the binary does not know, removed keys). A key's block is
    its line and the indented or list lines after it; comments and blank lines end it."""
    out, removed, skipping = [], [], False
    for line in text.splitlines(keepends=True):
        m = re.match(r"([A-Za-z][A-Za-z0-9]*):", line)
        if m:
            skipping = m.group(1) not in ("apiVersion", "kind") and config_key_flag(m.group(1)) not in known
            if skipping:
                removed.append(line.strip())
                continue
        elif skipping and line[:1] in (" ", "\t", "-"):
            continue
        else:
            skipping = False
        out.append(line)
    return "".join(out), removed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("report")
    p.add_argument("--image", required=True)
    p.add_argument("--busybox", required=True)
    p.add_argument("--kubelet-root", required=True)
    p.add_argument("--handover-dir", required=True)
    p.add_argument("--apiserver", required=True)
    p.add_argument("--binary", required=True)
    p.add_argument("--legacy-flags", action="store_true")
    o = p.parse_args()

    items = []
    for doc in json_stream(open(o.input).read()):
        items += doc["items"] if doc.get("kind") == "List" else [doc]
    daemonsets = [x for x in items if x.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        sys.exit(f"render.py: the manifests hold {len(daemonsets)} DaemonSets; expected one")
    ds = daemonsets[0]
    spec = ds["spec"]["template"]["spec"]
    known = known_flags(o.binary)
    host, port = o.apiserver.rsplit(":", 1)
    report = {"daemonset": ds["metadata"]["name"], "namespace": ds["metadata"].get("namespace", "default"),
              "stripped": [], "images": [], "hostPaths": [], "needs": [], "notes": []}

    proxies = [c for c in spec.get("containers", []) if PROXY_IMAGE_WORD in c.get("image", "") or c["name"] == PROXY_IMAGE_WORD]
    if len(proxies) != 1:
        sys.exit(f"render.py: expected one proxy container in the DaemonSet, found {len(proxies)}")
    proxy = proxies[0]
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        old = c.get("image", "")
        if c is proxy:
            c["image"] = o.image
        elif "busybox" in old:
            c["image"] = o.busybox
        else:
            sys.exit(f"render.py: container {c['name']} runs {old}, which the kit has no copy of (nothing is pulled)")
        c["imagePullPolicy"] = "Never"
        report["images"].append(f"{c['name']}: {old} -> {c['image']}")

    env = [e for e in proxy.get("env", []) if e["name"] not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")]
    env += [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
    proxy["env"] = env

    for field in ("command", "args"):
        if field not in proxy:
            continue
        kept, removed = strip_unknown(proxy[field], known)
        if removed and not o.legacy_flags:
            sys.exit(f"render.py: the binary does not know {' '.join(removed)} (in the container's {field}); "
                     "pass --legacy-flags to run it without them")
        proxy[field] = kept
        report["stripped"] += [[r, f"a flag of the container's {field}"] for r in removed]

    # The proxy's configuration file (--config), when a ConfigMap holds one: its keys are the
    # flags' names, and an older binary refuses a key it does not know just as a flag.
    for x in items:
        if x.get("kind") != "ConfigMap":
            continue
        for key, text in (x.get("data") or {}).items():
            if re.search(r"^kind:\s*ProxyConfiguration\s*$", text, re.M):
                kept, removed = strip_unknown_keys(text, known)
                if removed and not o.legacy_flags:
                    sys.exit(f"render.py: the binary does not know {', '.join(removed)} (ConfigMap "
                             f"{x['metadata']['name']}, {key}); pass --legacy-flags to run it without them")
                x["data"][key] = kept
                report["stripped"] += [[r, f"a key of {key}, ConfigMap {x['metadata']['name']}"] for r in removed]

    for v in spec.get("volumes", []):
        hp = v.get("hostPath")
        if hp:
            old = hp["path"]
            if old.startswith("/var/lib/kubelet/"):
                hp["path"] = o.kubelet_root.rstrip("/") + old[len("/var/lib/kubelet"):]
            elif old.rstrip("/") in ("/run/kubelet-auth-proxy", "/var/run/kubelet-auth-proxy"):
                hp["path"] = o.handover_dir
            else:
                report["notes"].append(f"hostPath {old} (volume {v['name']}) left as it is")
            report["hostPaths"].append(f"{v['name']}: {old} -> {hp['path']}")
        sources = [v] + [s for s in v.get("projected", {}).get("sources", [])]
        for s in sources:
            if "configMap" in s:
                report["needs"].append(["configmap", s["configMap"]["name"]])
            if "secret" in s:
                report["needs"].append(["secret", s["secret"].get("secretName") or s["secret"].get("name")])

    ns = report["namespace"]
    present = {(x.get("kind", "").lower(), x["metadata"]["name"]) for x in items
               if x.get("metadata", {}).get("namespace", ns) == ns}
    report["needs"] = [n for n in report["needs"] if tuple(n) not in present]
    report["selector"] = ds["spec"]["selector"]
    report["updateStrategy"] = ds["spec"].get("updateStrategy", {})
    report["terminationGracePeriodSeconds"] = spec.get("terminationGracePeriodSeconds", 30)
    report["args"] = proxy.get("args", [])
    # What decides how a rollout treats open sessions, as the pod gets it (flags, then the file).
    report["settings"] = [a for a in proxy.get("args", []) if re.search(r"grace|drain|handover", a, re.I)]
    for x in items:
        for text in (x.get("data") or {}).values() if x.get("kind") == "ConfigMap" else []:
            if re.search(r"^kind:\s*ProxyConfiguration\s*$", text, re.M):
                report["settings"] += [l.strip() for l in text.splitlines()
                                       if re.match(r"[A-Za-z]*(Grace|Drain|[Hh]andover)[A-Za-z]*:", l)]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, open(o.output, "w"), indent=1)
    json.dump(report, open(o.report, "w"), indent=1)


if __name__ == "__main__":
    main()
