#!/usr/bin/env bash
# Install the Debian packages the tests use as real peers, only if missing:
#   openssh-server  one OpenSSH sshd on loopback (SSH prober parity test)
#   prometheus      promtool to check the alert rules / scrape config
#   ethtool iproute2 (ip netns for tests that need their own network namespace)
#   faketime        libfaketime: skews a replica's wall clock only (lease fencing tests)
set -euo pipefail
need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "missing Debian packages: ${need[*]} (install them, or run as root)" >&2; exit 1; fi
else SUDO=""; fi
echo ">> installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# --no-install-recommends keeps prometheus from pulling node-exporter etc.; services are not started
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
