#!/usr/bin/env bash
# The browser test's tools (tests/test_browser.py): Debian's `chromium` and `chromium-driver`, installed with apt
# when either is missing. Idempotent: with both on PATH it installs nothing and says so. Nothing is downloaded
# but Debian packages through apt (no browser-install script, no selenium-manager): one source, so the browser
# and its driver are the same version. Needs root or sudo to install. On Ubuntu these apt packages hand over to
# snap; there, install Chromium and a chromedriver of the same version yourself.
#   scripts/browser-deps.sh            install what is missing
#   scripts/browser-deps.sh --dry-run  say what it would run, run nothing
set -euo pipefail

dry=0
case "${1:-}" in
  --dry-run | -n) dry=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

have() { command -v "$1" >/dev/null 2>&1; }
browser() { command -v chromium || command -v chromium-browser; }
# Debian's /usr/bin/chromium wrapper prints shell noise on stderr on some machines: keep the version line only
version() { "$1" --version 2>/dev/null | head -n 1; }

need=()
browser >/dev/null || need+=(chromium)
have chromedriver || need+=(chromium-driver)

if [ ${#need[@]} -eq 0 ]; then
  echo "browser-deps: nothing to do: $(version "$(browser)") and $(version chromedriver) are installed"
else
  if ! have apt-get; then
    echo "browser-deps: missing ${need[*]}, and there is no apt-get here (not Debian): install Chromium and the" \
      "chromedriver of the same version with this system's package manager; until then tests/test_browser.py skips" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! have sudo; then
      echo "browser-deps: missing ${need[*]}; installing them needs root: run this script as root (or install sudo)" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  run() {
    echo "browser-deps: $*"
    [ "$dry" = 1 ] || "$@"
  }
  echo "browser-deps: missing ${need[*]}: installing chromium and chromium-driver from apt"
  run "${sudo[@]}" apt-get update -q
  # both named: chromium-driver wants the chromium of its own version, so apt keeps the pair matched
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends chromium chromium-driver
  if [ "$dry" = 1 ]; then
    echo "browser-deps: dry run: nothing installed"
    exit 0
  fi
  browser >/dev/null && have chromedriver || {
    echo "browser-deps: apt finished but chromium or chromedriver is still not on PATH ($PATH)" >&2
    exit 1
  }
  echo "browser-deps: installed: $(version "$(browser)") and $(version chromedriver)"
fi

# A browser from elsewhere (a snap, a download) with Debian's driver fails only when the test starts a session
b=$(version "$(browser)" | grep -oE '[0-9]+' | head -n 1 || true)
d=$(version chromedriver | grep -oE '[0-9]+' | head -n 1 || true)
if [ -n "$b" ] && [ "$b" != "$d" ]; then
  echo "browser-deps: chromium $b but chromedriver $d: install both from apt" \
    "(apt-get install --reinstall chromium chromium-driver) or a matching pair" >&2
  exit 1
fi
