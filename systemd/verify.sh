#!/usr/bin/env bash
# Checks kubelet-auth-proxy.service and the credential-copy units as CI does, in a scratch root under target/ (nothing is
# installed on this machine, no root needed):
#   - systemd-analyze verify: syntax, directives, the ExecStart binary. It exits 0 on an unknown or
#     misspelt directive and only warns, so any output at all is a failure here;
#   - systemd-analyze security --offline: the hardening must keep the exposure at or below 2.0;
#   - systemd-sysusers --dry-run: the sysusers.d snippet creates the service user.
# Needs systemd 252 or newer (Debian 12: apt-get install -y --no-install-recommends systemd).
# Usage: systemd/verify.sh target/debug/kubelet-auth-proxy
set -euo pipefail

binary=${1:?usage: $0 path/to/kubelet-auth-proxy}
here=$(cd "$(dirname "$0")" && pwd)
scratch_parent=${CARGO_TARGET_DIR:-$here/../target}
mkdir -p "$scratch_parent"
root=$(mktemp -d "$scratch_parent/systemd-verify.XXXXXX")
trap 'rm -rf "$root"' EXIT

# The targets the unit refers to (network-online.target, multi-user.target, ...) must exist in
# the root too.
for units in /usr/lib/systemd/system /lib/systemd/system; do
  if [ -d "$units" ]; then break; fi
done
mkdir -p "$root/usr/local/bin" "$root/usr/lib/systemd" "$root/etc/systemd/system"
cp -r "$units" "$root/usr/lib/systemd/system"
# A hard link when the binary is on the same filesystem (a debug binary is large).
ln "$binary" "$root/usr/local/bin/kubelet-auth-proxy" 2>/dev/null ||
  cp "$binary" "$root/usr/local/bin/kubelet-auth-proxy"
units=(kubelet-auth-proxy.service kubelet-auth-proxy.socket kubelet-auth-proxy-credentials.service
  kubelet-auth-proxy-credentials.path)
for unit in "${units[@]}"; do
  cp "$here/$unit" "$root/etc/systemd/system/"
done
# The programs the credential copy and the reload run.
mkdir -p "$root/usr/bin"
cp "$(command -v install)" "$(command -v mv)" "$root/usr/bin/"
# ExecReload= of the proxy's unit.
mkdir -p "$root/bin"
cp /bin/kill "$root/bin/"

for unit in "${units[@]}"; do
  echo "systemd-analyze verify $unit"
  if ! output=$(systemd-analyze verify --root="$root" "$unit" 2>&1) || [ -n "$output" ]; then
    echo "$output" >&2
    exit 1
  fi
done

for unit in kubelet-auth-proxy.service kubelet-auth-proxy-credentials.service; do
  echo "systemd-analyze security --offline $unit"
  systemd-analyze security --offline=yes --threshold=20 --no-pager --root="$root" \
    "$unit" | tail -n 1
done

echo "systemd-sysusers --dry-run kubelet-auth-proxy.sysusers"
systemd-sysusers --root="$root" --dry-run "$here/kubelet-auth-proxy.sysusers"
