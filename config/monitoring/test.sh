#!/usr/bin/env bash
# Checks the alerting rules and the dashboard as Prometheus reads them, with promtool:
#   - alerts.yaml is a valid rules file (`promtool check rules`);
#   - every alert behaves as alerts.test.yaml says (`promtool test rules`: series in, alerts out);
#   - every query of dashboard.json parses (each becomes a recording rule of a scratch rules file
#     that `promtool check rules` reads; Grafana's $__rate_interval is replaced by 5m).
# That every metric these name is one the proxy exports is checked by `cargo test`
# (tests/e2e/monitoring.rs), which needs no promtool.
#
# promtool is taken from PATH, else from Debian's `prometheus` package, unpacked (not installed:
# the package's init script would start a Prometheus server) into target/tools/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

promtool=$(command -v promtool || true)
if [[ -z $promtool ]]; then
  tools="${CARGO_TARGET_DIR:-$root/target}/tools"
  promtool="$tools/promtool"
  if [[ ! -x $promtool ]]; then
    for tool in apt-get dpkg-deb jq; do
      if ! command -v "$tool" >/dev/null 2>&1; then
        echo "promtool is not on PATH and $tool is missing to fetch it: install Debian's" \
          "prometheus package (or put promtool on PATH)" >&2
        exit 1
      fi
    done
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    # apt-get download writes into the current directory; a fresh machine may have no lists yet.
    if ! (cd "$download" && apt-get download -q prometheus >/dev/null 2>&1); then
      apt-get update -qq
      (cd "$download" && apt-get download -q prometheus >/dev/null)
    fi
    mkdir -p "$download/unpacked" "$tools"
    dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -C "$download/unpacked" ./usr/bin/promtool
    mv "$download/unpacked/usr/bin/promtool" "$promtool"
  fi
fi
if ! command -v jq >/dev/null 2>&1; then
  echo "jq is required to read dashboard.json (apt-get install jq)" >&2
  exit 1
fi
"$promtool" --version 2>&1 | head -n 1

cd "$here"
"$promtool" check rules alerts.yaml
"$promtool" test rules alerts.test.yaml

queries=$(mktemp)
trap 'rm -f "$queries"; rm -rf "${download:-}"' EXIT
jq -r '
  [recurse | objects | select(has("expr")) | .expr | gsub("\\$__rate_interval"; "5m")]
  | to_entries
  | "groups:\n  - name: dashboard\n    rules:\n"
    + (map("      - record: dashboard_query_\(.key)\n        expr: \(.value | tojson)") | join("\n"))
' dashboard.json >"$queries"
count=$(grep -c 'record:' "$queries")
echo "Checking the $count queries of dashboard.json"
"$promtool" check rules "$queries" >/dev/null
echo "  SUCCESS: $count queries parse"
