#!/usr/bin/env bash
# A real S3-compatible server for the artifact store's S3 tests: s3rver (npm), installed once per
# machine into the tools cache (scripts/_service.sh's tools_cache_dir), outside the checkout.
#
# Usage: scripts/s3_server.sh install   install it (npm; once) and print the path of its command
#        scripts/s3_server.sh path      print that path when installed (exit 1 otherwise)
# The tests start it themselves (node PATH -d DIR -a 127.0.0.1 -p PORT --silent) and stop it.
set -euo pipefail

VERSION="3.7.1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/_service.sh
source "$here/_service.sh"
folder="$(tools_cache_dir)/s3rver-$VERSION"
command_path="$folder/node_modules/s3rver/bin/s3rver.js"

case "${1:-}" in
  install)
    if [[ ! -f "$command_path" ]]; then
      command -v npm >/dev/null 2>&1 || { echo "s3_server: npm not found (apt-get install npm)" >&2; exit 1; }
      mkdir -p "$folder"
      npm install --no-audit --no-fund --prefix "$folder" "s3rver@$VERSION" >&2
    fi
    echo "$command_path"
    ;;
  path)
    [[ -f "$command_path" ]] || exit 1
    echo "$command_path"
    ;;
  *)
    echo "usage: $0 install|path" >&2
    exit 2
    ;;
esac
