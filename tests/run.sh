#!/usr/bin/env bash
# The test command: lint, the layers contract, the test suite (CPU only) and, beside it, the
# native-path parity tests in a Python 3.12 environment with jax >= 0.11 when one can be made
# (skipped, saying so, otherwise). Arguments go to the suite's pytest, e.g.
# `bash tests/run.sh -m "not slow"`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m ruff format --check fp4lab tests benchmarks experiments notebooks results setup.py || exit 1
"$PY" -m ruff check . || exit 1  # everything: the package, tests, notebooks, results, setup.py
"$(dirname "$PY")/lint-imports" --no-cache || exit 1
# The native-path environment (Python 3.12, jax >= 0.11) is made, and its tests run, while the
# suite runs: its install is mostly the kernels' C++ build, which would otherwise wait for the
# suite to end. Their output is shown after the suite's.
native_log=$(mktemp)
native=""
stop_native() {  # on any exit: nothing of it outlives the command (its children first)
  [ -n "$native" ] && { pkill -TERM -P "$native" 2>/dev/null; kill "$native" 2>/dev/null; }
  rm -f "$native_log"
}
trap stop_native EXIT
make_native() {
  local py312=""
  if python3.12 -c "" 2>/dev/null; then py312="python3.12"
  elif PYENV_VERSION=3.12.1 python3.12 -c "" 2>/dev/null; then py312="env PYENV_VERSION=3.12.1 python3.12"
  fi
  if [ -z "$py312" ]; then
    echo "SKIPPED native-path parity tests: no Python 3.12 on this machine (jax >= 0.11 needs it)"
    return 1
  fi
  [ -x .venv312/bin/python ] && return 0
  # only what the native tests import (jax >= 0.11, and the test conftest's pandas/pyarrow),
  # then fp4lab built against that jaxlib (no isolated build environment with a second one)
  $py312 -m venv .venv312 && .venv312/bin/pip install -q --no-compile --no-warn-conflicts \
      "jax>=0.11" "ml_dtypes>=0.5" "numpy>=1.26" "pandas>=2.1" "pyarrow>=14" pytest "setuptools>=68" \
    && .venv312/bin/pip install -q --no-compile --no-deps --no-build-isolation -e . && return 0
  echo "SKIPPED native-path parity tests: could not install jax >= 0.11 for Python 3.12"
  rm -rf .venv312
  return 1
}
native_tests() {
  make_native || return 77  # skipped, saying why
  echo "native-path parity tests (Python 3.12, jax $(.venv312/bin/python -c 'import jax; print(jax.__version__)')):"
  .venv312/bin/python -m pytest -p no:cacheprovider tests/native
}
native_tests > "$native_log" 2>&1 &
native=$!

"$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@"
rc=$?
wait "$native"
native_rc=$?
cat "$native_log"
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: that is a failure here"; exit 1; fi
[ "$rc" -eq 0 ] || exit "$rc"
[ "$native_rc" -eq 77 ] && exit 0  # skipped, as said above
exit "$native_rc"
