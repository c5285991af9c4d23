#!/usr/bin/env bash
# Build (or reuse) the local control plane binaries: etcd, kube-apiserver,
# kube-controller-manager, helm. Binaries go to a cache directory outside the
# repository, keyed by version, so only the first run on a machine pays for the
# build. Prints the directory holding the binaries on stdout (last line).
#
#   e2e/controlplane/build.sh            # build if missing, print dir
#   NODEWARDEN_CACHE=/path build.sh      # other cache root
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="v1.37.2"
ETCD_VERSION="v3.7.0"
HELM_VERSION="v4.3.1"
cache_root="${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}"
# The key includes a hash of go.mod/go.sum so a dependency change rebuilds.
mod_hash="$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)"
out="$cache_root/controlplane/${K8S_VERSION}-etcd${ETCD_VERSION}-helm${HELM_VERSION}-${mod_hash}"

want=(etcd kube-apiserver kube-controller-manager helm)
missing=()
for b in "${want[@]}"; do
  [[ -x "$out/$b" ]] || missing+=("$b")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
lock="$out/.build.lock"
exec 9>"$lock"
flock 9
# Another process may have finished the build while we waited for the lock.
missing=()
for b in "${want[@]}"; do
  [[ -x "$out/$b" ]] || missing+=("$b")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "$out"
  exit 0
fi

major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=${major}"
ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=${major}"
ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=${minor}"

export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
start=$(date +%s)
echo ">> building the local control plane (${K8S_VERSION}, etcd ${ETCD_VERSION}, helm ${HELM_VERSION})" >&2
echo ">> first build on this machine: expect 10-30 minutes on 2 cores; cached in $out" >&2

build() {  # build <name> <package>
  local name="$1" pkg="$2" t0
  [[ -x "$out/$name" ]] && return 0
  t0=$(date +%s)
  echo ">> go build $pkg ..." >&2
  # A heartbeat so a person (or CI log) sees the build is alive.
  ( while sleep 60; do echo ">>   still building $name ($(( $(date +%s) - t0 ))s)" >&2; done ) &
  local hb=$!
  if ! (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg"); then
    kill "$hb" 2>/dev/null || true
    echo ">> build of $name failed" >&2
    exit 1
  fi
  kill "$hb" 2>/dev/null || true
  mv "$out/$name.tmp" "$out/$name"
  echo ">> built $name in $(( $(date +%s) - t0 ))s" >&2
}

build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager

if [[ ! -x "$out/helm" ]]; then
  echo ">> go install helm.sh/helm/v4/cmd/helm@${HELM_VERSION} ..." >&2
  GOBIN="$out/.helm-bin" GOFLAGS="-buildvcs=false" go install "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"
  mv "$out/.helm-bin/helm" "$out/helm"
  rmdir "$out/.helm-bin" 2>/dev/null || true
fi

echo ">> control plane ready in $(( $(date +%s) - start ))s" >&2
echo "$out"
