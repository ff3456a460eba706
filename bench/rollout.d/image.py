#!/usr/bin/env python3
"""bench/rollout.d/image.py BINARY NAME OUT.tar: an OCI image archive of one proxy binary.

There is no image builder and no registry where bench/rollout runs, so the image is put together
here with the standard library and imported into the kit's containerd with `ctr images import`:

- one layer: BINARY at /kubelet-auth-proxy (where the DaemonSet's probes run it), and the shared
  libraries `ldd BINARY` names (libc, libm, libgcc_s, the dynamic loader), each at the path ldd
  names, as regular files (a symbolic link on the host would point into nothing in the image);
- a config with that entrypoint and the user the project's image runs as (10250:10250: the
  DaemonSet's runAsUser, runAsGroup and fsGroup), so runAsNonRoot holds;
- an OCI layout (index.json, blobs), as the kit's own busybox.tar, whose index names the image
  NAME in `io.containerd.image.name`: containerd files it under exactly that name, which is the
  name the kubelet asks for (docker.io/local/kubelet-auth-proxy:LABEL for local/...:LABEL).

The layer is written deterministically (fixed times and owners) so that the same binary gives the
same image digest; two binaries give two digests, which the run reports.
"""
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile


def libraries(binary):
    """The shared libraries the dynamic loader would map for BINARY, as (path in image, file)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"\S+ => (/\S+) \(0x", line)  # libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
        if not m:
            m = re.match(r"(/\S+) \(0x", line)  # /lib64/ld-linux-x86-64.so.2 (0x...)
        if m:
            libs.append((m.group(1), m.group(1)))
        elif "not found" in line:
            sys.exit(f"image.py: ldd {binary}: {line}")
    return libs


def layer(binary):
    files = [("/kubelet-auth-proxy", binary)] + libraries(binary)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for path, _ in files:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        # Only the directories the files live in: the runtime makes the mount points of the pod's
        # volumes itself.
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, source in files:
            with open(os.path.realpath(source), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), [p for p, _ in files]


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: image.py BINARY NAME OUT.tar")
    binary, name, out = sys.argv[1:]
    tar_bytes, paths = layer(binary)
    blobs = {}

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return f"sha256:{digest}", len(data)

    layer_digest, layer_size = blob(tar_bytes)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"User": "10250:10250", "Entrypoint": ["/kubelet-auth-proxy"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "bench/rollout.d/image.py"}],
    }
    config_digest, config_size = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    }
    manifest_digest, manifest_size = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        }],
    }
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(path, data):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in sorted(blobs.items()):
            add(f"blobs/sha256/{digest}", data)
    # What the run reports: the image's manifest digest and what the layer holds.
    print(manifest_digest, " ".join(paths))


if __name__ == "__main__":
    main()
