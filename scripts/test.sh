#!/usr/bin/env bash
# Every check CI runs, in CI's order: set up with the dev tools, then lint, types, the docs
# site and the whole test suite. Arguments go to pytest (``bash scripts/test.sh tests/server``).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy (strict, src/)" >&2
.venv/bin/mypy
echo "== mkdocs build --strict" >&2
# NO_MKDOCS_2_WARNING: Material's notice about MkDocs 2 is not a warning of this site's
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site
echo "== pytest" >&2
.venv/bin/pytest "$@"
