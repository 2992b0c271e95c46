#!/usr/bin/env bash
# Make a Chromium available for the real-browser tests (tests/test_browser.py), where we can:
#   $EXPLORER_CHROMIUM if set, else Debian's chromium (/usr/bin/chromium), installed with apt-get when
#   missing and we are root. Playwright's own browser download is never used.
# Never fails `make test`: it prints why not; the browser tests then skip with that reason,
# and under CI=true that skip is a failure.
set -u

works() {  # the binary exists and starts headless
  [ -x "$1" ] && "$1" --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1
}

if [ -n "${EXPLORER_CHROMIUM:-}" ]; then
  if works "$EXPLORER_CHROMIUM"; then exit 0; fi
  echo "browser tests: EXPLORER_CHROMIUM=$EXPLORER_CHROMIUM does not start; trying Debian chromium"
fi
for candidate in /usr/bin/chromium "$(command -v chromium 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && works "$candidate"; then exit 0; fi
done
if [ "$(id -u)" != "0" ]; then
  echo "browser tests: chromium is missing and we are not root; install it with 'sudo apt-get install chromium'" \
       "or set EXPLORER_CHROMIUM=/path/to/chromium"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser tests: chromium is missing and there is no apt-get here; install Chromium and set" \
       "EXPLORER_CHROMIUM=/path/to/chromium"
  exit 0
fi
echo "installing Debian chromium for the browser tests (apt-get)..."
export DEBIAN_FRONTEND=noninteractive
if (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core) >/dev/null; then
  works /usr/bin/chromium && echo "chromium: $(/usr/bin/chromium --version 2>/dev/null)" && exit 0
  echo "browser tests: chromium was installed but does not start headless"
else
  echo "browser tests: apt-get could not install chromium"
fi
exit 0
