#!/usr/bin/env bash
# The Debian packages the test suite needs, in one list. With no argument, installs the missing
# ones (as root, with apt-get): .ci/run does this, and so does a person told to by `npm test`.
# With --check, installs nothing: says what is missing and the command that installs it, and exits
# 1 (`npm test` runs this first, as part of `pretest`). With --notice, prints the loud notice of
# a run that skipped tests knowingly (`posttest`). What is missing is found by asking each tool or
# module itself, as the tests do, not the package database.
#
# LIGHTNING_SKIP_MISSING_TOOLS=1: run the suite anyway; the tests that need what is missing are
# skipped, and said so at the start and at the end. Ignored under CI (CI set): there nothing is
# ever skipped.
set -uo pipefail

# package|probe (a shell command that succeeds when what the tests use is there)
DEPS=(
  # an independent Kafka client (librdkafka) for the test broker's interop test
  "kcat|kcat -V"
  # promtool lints a live /metrics page and the alert rules; prometheus evaluates the alerts
  "prometheus|promtool --version && prometheus --version"
  # the trainer-side Python client's tests: Debian's interpreter, its modules, and protoc. The
  # modules are asked of /usr/bin/python3, the interpreter these packages install into and the one
  # every Python test can use: a `python3` earlier on PATH (pyenv, a venv) may have some of them and
  # not others, and no test can use modules split over two interpreters.
  "python3|/usr/bin/python3 --version"
  "python3-confluent-kafka|/usr/bin/python3 -c 'import confluent_kafka'"
  "python3-protobuf|/usr/bin/python3 -c 'import google.protobuf'"
  "protobuf-compiler|protoc --version"
  "python3-pytest|/usr/bin/python3 -c 'import pytest'"
  "python3-numpy|/usr/bin/python3 -c 'import numpy'"
  # a fresh venv of Debian's python3 for the client's install test (test/python/packaging.test.ts)
  "python3-venv|/usr/bin/python3 -c 'import venv, ensurepip'"
  # a real browser for the viewer's tests (driven by npm playwright-core; no browser download)
  "chromium|chromium --version"
)

missing() {
  local out="" d
  for d in "${DEPS[@]}"; do
    bash -c "${d#*|}" >/dev/null 2>&1 || out="$out ${d%%|*}"
  done
  echo "${out# }"
}

is_ci() { [ -n "${CI:-}" ] && [ "${CI}" != "false" ] && [ "${CI}" != "0" ]; }

case "${1:-install}" in
  install)
    todo=$(missing)
    [ -z "$todo" ] && exit 0
    if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
      echo "missing Debian packages: $todo; install them as root: sudo .ci/install-deps.sh" >&2
      exit 1
    fi
    timeout 300 apt-get update -qq || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends $todo >/dev/null || exit 1
    still=$(missing)
    if [ -n "$still" ]; then
      echo "installed, but the tests still cannot use: $still" >&2
      exit 1
    fi
    ;;
  --check)
    todo=$(missing)
    [ -z "$todo" ] && exit 0
    if is_ci; then
      echo "npm test: missing Debian packages: $todo (CI never skips tests; .ci/run installs them: .ci/install-deps.sh)" >&2
      exit 1
    fi
    if [ "${LIGHTNING_SKIP_MISSING_TOOLS:-}" = "1" ]; then
      echo "npm test: LIGHTNING_SKIP_MISSING_TOOLS=1: the tests that need $todo will be SKIPPED" >&2
      exit 0
    fi
    echo "npm test: missing Debian packages: $todo. Install them with: sudo .ci/install-deps.sh (or run LIGHTNING_SKIP_MISSING_TOOLS=1 npm test to skip the tests that need them)" >&2
    exit 1
    ;;
  --notice)
    todo=$(missing)
    if [ -n "$todo" ] && [ "${LIGHTNING_SKIP_MISSING_TOOLS:-}" = "1" ] && ! is_ci; then
      echo "" >&2
      echo "************************************************************************" >&2
      echo "npm test: tests were SKIPPED (LIGHTNING_SKIP_MISSING_TOOLS=1): missing $todo" >&2
      echo "a skipped test cannot fail; install them with: sudo .ci/install-deps.sh" >&2
      echo "************************************************************************" >&2
    fi
    exit 0
    ;;
  *)
    echo "usage: .ci/install-deps.sh [--check | --notice]" >&2
    exit 2
    ;;
esac
