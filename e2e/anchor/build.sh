#!/usr/bin/env bash
# Build (or reuse) the binaries of the side-by-side anchor benchmark
# (benchmarks/bench_anchor.py): Karpenter's KWOK provider (`karpenter-kwok`), the KWOK
# controller (`kwok`) and kube-scheduler, all from the Go module proxy. They go to a cache
# directory outside the repository keyed by the three versions and the hash of the
# control plane's wrapper module (e2e/controlplane/go.mod + go.sum, which kube-scheduler
# is built from), so only the first run on a machine pays. Prints the directory on stdout
# (last line).
#
#   e2e/anchor/build.sh              # build if missing, print dir
#   NODEWARDEN_CACHE=/path build.sh  # other cache root
#   e2e/anchor/build.sh --sources    # the source directories of the two modules in the
#                                    # module cache (downloaded if missing), one per line:
#                                    # karpenter <dir>, kwok <dir> (CRDs and KWOK stages)
#
# Karpenter v1.15.0's go.mod needs Go >= 1.26.9: it is built with GOTOOLCHAIN (fetched
# through the module proxy like any module). Both Karpenter's provider and KWOK install a
# binary named `kwok`, so each gets its own GOBIN.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/../controlplane"
KARPENTER_VERSION="v1.15.0"
KWOK_VERSION="v0.8.0"
KARPENTER_GOTOOLCHAIN="go1.27.3"
K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$module/go.mod")"
[[ -n "$K8S_VERSION" ]] || { echo "no k8s.io/kubernetes requirement in $module/go.mod" >&2; exit 1; }
if [[ "${1:-}" == "--sources" ]]; then
  source_dir() {  # source_dir <module>@<version> [GOTOOLCHAIN]
    env ${2:+GOTOOLCHAIN="$2"} GOFLAGS=-mod=mod go mod download -json "$1" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
  }
  karpenter_dir="$(source_dir "sigs.k8s.io/karpenter@${KARPENTER_VERSION}" "$KARPENTER_GOTOOLCHAIN")"
  kwok_dir="$(source_dir "sigs.k8s.io/kwok@${KWOK_VERSION}")"
  [[ -d "$karpenter_dir" && -d "$kwok_dir" ]] || { echo "go mod download failed" >&2; exit 1; }
  echo "karpenter $karpenter_dir"
  echo "kwok $kwok_dir"
  exit 0
fi
cache_root="${NODEWARDEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarden}"
mod_hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)"
out="$cache_root/anchor/karpenter${KARPENTER_VERSION}-kwok${KWOK_VERSION}-k8s${K8S_VERSION}-${mod_hash}"

want=(karpenter-kwok kwok kube-scheduler)
have_all() {
  local b
  for b in "${want[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}
if have_all; then echo "$out"; exit 0; fi

mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
# Another process may have finished the build while we waited for the lock.
if have_all; then echo "$out"; exit 0; fi

export CGO_ENABLED=0
start=$(date +%s)
echo ">> building the anchor (Karpenter ${KARPENTER_VERSION} KWOK provider, KWOK ${KWOK_VERSION}, kube-scheduler ${K8S_VERSION}); cached in $out" >&2
echo ">> first build on this machine: expect 5-15 minutes on 2 cores" >&2

heartbeat() {  # heartbeat <name> <t0>: a line a minute so a person sees the build is alive
  while sleep 60; do echo ">>   still building $1 ($(( $(date +%s) - $2 ))s)" >&2; done
}

install_bin() {  # install_bin <name> <module path>@<version> [GOTOOLCHAIN]
  local name="$1" target="$2" toolchain="${3:-}" t0 hb gobin
  [[ -x "$out/$name" ]] && return 0
  t0=$(date +%s)
  gobin="$out/.gobin-$name"
  rm -rf "$gobin"
  echo ">> go install $target ..." >&2
  heartbeat "$name" "$t0" &
  hb=$!
  if ! env ${toolchain:+GOTOOLCHAIN="$toolchain"} GOBIN="$gobin" GOFLAGS="-buildvcs=false -trimpath" \
      go install "$target"; then
    kill "$hb" 2>/dev/null || true
    echo ">> build of $name failed" >&2
    exit 1
  fi
  kill "$hb" 2>/dev/null || true
  # go install names the binary after the package directory: both are `kwok`
  mv "$gobin/kwok" "$out/$name"
  rm -rf "$gobin"
  echo ">> built $name in $(( $(date +%s) - t0 ))s" >&2
}

install_bin karpenter-kwok "sigs.k8s.io/karpenter/kwok@${KARPENTER_VERSION}" "$KARPENTER_GOTOOLCHAIN"
install_bin kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"

if [[ ! -x "$out/kube-scheduler" ]]; then
  # Built like kube-apiserver: from a copy of the control plane's wrapper module (read,
  # never modified), with the same version stamps.
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
  t0=$(date +%s)
  echo ">> go build k8s.io/kubernetes/cmd/kube-scheduler ..." >&2
  heartbeat kube-scheduler "$t0" &
  hb=$!
  if ! (cd "$work" && GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ldflags" \
      -o "$out/kube-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler); then
    kill "$hb" 2>/dev/null || true
    echo ">> build of kube-scheduler failed" >&2
    exit 1
  fi
  kill "$hb" 2>/dev/null || true
  mv "$out/kube-scheduler.tmp" "$out/kube-scheduler"
  rm -rf "$work"
  echo ">> built kube-scheduler in $(( $(date +%s) - t0 ))s" >&2
fi

echo ">> anchor binaries ready in $(( $(date +%s) - start ))s" >&2
echo "$out"
