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
