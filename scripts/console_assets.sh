#!/usr/bin/env bash
# The web console's scripts (htmx, its SSE extension, Mermaid) from the npm registry: `npm ci`
# installs the versions package-lock.json pins (integrity-checked) into node_modules/, then the
# files the console serves are copied into runtime/_console/static/vendor/ (package data of the
# wheel; both folders are gitignored: nothing of them is committed).
# Usage: scripts/console_assets.sh [--optional]   (--optional: without npm, say so and exit 0)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
vendor=runtime/_console/static/vendor
if ! command -v npm >/dev/null 2>&1; then
  echo "console assets: npm not found; 'stratagem console' will serve pages without live" \
    "updates or the DAG drawing until npm is installed (Debian: apt-get install npm) and" \
    "'make console-assets' runs" >&2
  [ "${1:-}" = "--optional" ] && exit 0
  exit 1
fi
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
mkdir -p "$vendor"
grep -v '^#' runtime/_console/vendor.txt | while read -r name source; do
  [ -n "$name" ] && cp "node_modules/$source" "$vendor/$name"
done
touch "$vendor/.installed"
