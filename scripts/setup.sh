#!/usr/bin/env bash
# Set up tidings on a fresh machine: a virtual environment in .venv with the package installed.
# Usage: bash scripts/setup.sh [--dev]
#   --dev  also install the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java not found, installing a JRE (Spark needs Java 17+)" >&2
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup: install Java 17 or newer and run again" >&2; exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"
.venv/bin/python -m pip install -q -e ".${extra}"

# The real FutoIn FTN18 client for the stream interop tests and benchmark (pinned by its
# lockfile); only with --dev, and only where Node is installed.
if [ -n "$extra" ]; then
  futoin=tests/interop/futoin
  if [ "$futoin/node_modules/.package-lock.json" -nt "$futoin/package-lock.json" ]; then
    :  # installed from this lockfile already
  elif command -v npm >/dev/null 2>&1; then
    npm ci --prefix "$futoin" --no-audit --no-fund --loglevel=error >/dev/null
  else
    echo "setup: npm not found: the FutoIn interop tests will fail (install Node 20)" >&2
  fi
  # Debian's Chromium, headless, for the web page tests; never fatal: without it those tests
  # fail saying Chromium is missing.
  if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >/dev/null 2>&1 || echo "setup: could not install chromium: the web page tests will fail" >&2
  fi
fi
