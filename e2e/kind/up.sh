#!/usr/bin/env bash
# For people who have Docker: a kind cluster with nodewarden installed by its Helm chart,
# to look around. e2e/kind/e2e.sh runs the assertions of `make e2e` on kind.
# NOT run by CI and cannot run on the development machines (no Docker engine); `make e2e`
# (e2e/dataplane/) is the same on a local kubelet in network namespaces.
#
#   e2e/kind/up.sh            # cluster "nodewarden", image built from the Dockerfile
#   e2e/kind/down.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
name="${KIND_CLUSTER:-nodewarden}"
image="nodewarden:dev"
command -v kind >/dev/null || { echo "kind not found: go install sigs.k8s.io/kind@latest" >&2; exit 1; }
command -v docker >/dev/null || { echo "docker not found" >&2; exit 1; }
helm="$("$repo/e2e/controlplane/build.sh")/helm"
kind get clusters | grep -qx "$name" || kind create cluster --name "$name" --wait 120s
docker build -t "$image" "$repo"
kind load docker-image "$image" --name "$name"
"$helm" upgrade --install nodewarden "$repo/helm/nodewarden" \
  --kube-context "kind-$name" --namespace nodewarden --create-namespace \
  --set image.repository=docker.io/library/nodewarden --set image.tag=dev --set image.pullPolicy=Never \
  --set replicas=2
kubectl --context "kind-$name" -n nodewarden apply -f "$repo/examples/01-powerpolicy-default.yaml"
kubectl --context "kind-$name" -n nodewarden rollout status deploy/nodewarden --timeout=120s
echo "kubectl --context kind-$name -n nodewarden get wn,pp,cd,pi"
