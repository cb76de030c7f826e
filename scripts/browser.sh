#!/usr/bin/env bash
# The browser the console's tests drive: Debian's Chromium at /usr/bin/chromium (Playwright is
# pointed at it; nothing is downloaded at test time). Installed with apt-get when missing and this
# runs as root; otherwise the command to run is printed and the script fails.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's chromium for the console's browser tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends chromium >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; }
  exit 0
fi
echo "the console's browser tests need Chromium at /usr/bin/chromium:" \
  "sudo apt-get install chromium" >&2
exit 1
