#!/usr/bin/env bash
# The test command: lint, then the test suite (CPU only). Exit code: non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m ruff format --check fp4lab tests benchmarks || exit 1
"$PY" -m ruff check fp4lab tests benchmarks || exit 1
"$PY" -m pytest -n 2 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: that is a failure here"; exit 1; fi
exit "$rc"
