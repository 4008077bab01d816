#!/usr/bin/env bash
# Installs what the tests and benches need from the distribution's packages,
# only when missing. Idempotent; run as root (or with sudo available).
#   etcd-server   registry store (tests spawn their own etcd on free ports)
#   redis-server  context store
#   wrk, haproxy  router benchmark (load generator, comparison proxy)
#   prometheus    deploy tests (real Prometheus scraping the stack; ships promtool)
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: everything needed is installed"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${need[*]}"
$sudo apt-get update -qq
# Services the packages would start are not used: tests start their own on free loopback ports.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
