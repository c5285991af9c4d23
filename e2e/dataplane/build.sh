#!/usr/bin/env bash
# Build (or reuse) the data-plane binaries of the local cluster: kubelet, kube-scheduler
# and kube-proxy, from the same wrapper module as the control plane
# (e2e/controlplane/go.mod, read but never modified: the module is copied to a work
# directory in the cache, where `go build -mod=mod` may add the go.sum lines the kubelet
# needs). Also `kubeconform` (offline schema checks of the chart). Binaries go to a cache
# directory outside the repository keyed by the Kubernetes version and the module's hash,
# so only the first run on a machine pays. Prints the directory on stdout (last line).
#
#   e2e/dataplane/build.sh              # build if missing, print dir
#   NODEWARDEN_CACHE=/path build.sh     # other cache root
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/../controlplane"
KUBECONFORM_VERSION="v0.7.0"
# The Kubernetes version is the one the wrapper module requires.
K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$module/go.mod")"
[[ -n "$K8S_VERSION" ]] || { echo "no k8s.io/kubernetes requirement in $module/go.mod" >&2; exit 1; }
cache_root="${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}"
mod_hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)"
out="$cache_root/dataplane/${K8S_VERSION}-kubeconform${KUBECONFORM_VERSION}-${mod_hash}"

want=(kubelet kube-scheduler kube-proxy kubeconform)
have_all() {
  local b
  for b in "${want[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}
if have_all; then echo "$out"; exit 0; fi

mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
if have_all; then echo "$out"; exit 0; fi

major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=${major} -X $pkg.gitMinor=${minor}"
done
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

work="$out/.module"
rm -rf "$work" && mkdir -p "$work"
cp "$module/go.mod" "$module/go.sum" "$work/"
export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
start=$(date +%s)
echo ">> building the data plane (${K8S_VERSION}): kubelet, kube-scheduler, kube-proxy; cached in $out" >&2
build() {  # build <name> <package>
  local name="$1" pkg="$2" t0
  [[ -x "$out/$name" ]] && return 0
  t0=$(date +%s)
  echo ">> go build $pkg ..." >&2
  ( while sleep 60; do echo ">>   still building $name ($(( $(date +%s) - t0 ))s)" >&2; done ) &
  local hb=$!
  if ! (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg"); then
    kill "$hb" 2>/dev/null || true
    echo ">> build of $name failed" >&2
    exit 1
  fi
  kill "$hb" 2>/dev/null || true
  mv "$out/$name.tmp" "$out/$name"
  echo ">> built $name in $(( $(date +%s) - t0 ))s" >&2
}
build kubelet k8s.io/kubernetes/cmd/kubelet
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy
rm -rf "$work"

if [[ ! -x "$out/kubeconform" ]]; then
  echo ">> go install github.com/yannh/kubeconform/cmd/kubeconform@${KUBECONFORM_VERSION} ..." >&2
  GOBIN="$out/.kc-bin" GOFLAGS="-buildvcs=false" go install \
    "github.com/yannh/kubeconform/cmd/kubeconform@${KUBECONFORM_VERSION}"
  mv "$out/.kc-bin/kubeconform" "$out/kubeconform"
  rmdir "$out/.kc-bin" 2>/dev/null || true
fi
echo ">> data plane binaries ready in $(( $(date +%s) - start ))s" >&2
echo "$out"
