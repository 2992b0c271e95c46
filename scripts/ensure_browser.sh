#!/usr/bin/env bash
# Make Debian's chromium available for the real-browser tests, where we can.
# Prints why not where we cannot; the browser tests then skip (and fail under CI=true).
set -u
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "browser tests: chromium is missing and we are not root; install it with 'sudo apt-get install chromium'"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser tests: chromium is missing and there is no apt-get here; install Chromium and set EXPLORER_CHROMIUM=/path/to/chromium"
  exit 0
fi
echo "installing Debian chromium for the browser tests (apt-get)..."
export DEBIAN_FRONTEND=noninteractive
(apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
  || echo "browser tests: apt-get could not install chromium"
exit 0
