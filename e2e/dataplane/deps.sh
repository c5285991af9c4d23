#!/usr/bin/env bash
# Install the Debian packages of the e2e data plane, only those missing:
#   containerd runc containernetworking-plugins  the node's container runtime and CNI (bridge)
#   iptables conntrack                           kube-proxy (iptables mode) and the namespaces' NAT
#   buildah podman debootstrap                   the images, built without a Docker engine
#   prometheus                                   scrapes the operator Pods (promtool too)
set -euo pipefail
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in containerd runc containernetworking-plugins iptables conntrack buildah podman \
           debootstrap prometheus; do
  have "$pkg" || need+=("$pkg")
done
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "e2e data plane: missing Debian packages: ${need[*]} (install them as root)" >&2
  exit 1
fi
echo ">> installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
