"""The e2e data plane: a one-node Kubernetes cluster with a real kubelet, inside network
namespaces the test creates, running the operator image built from the project's Dockerfile.

Modules: `netns` (the two network namespaces and their addresses), `images` (Debian base
by debootstrap, pause, the operator image; cached outside the repository), `node`
(containerd, kubelet, kube-scheduler, kube-proxy and the control plane of
`e2e/localcluster.py` with the flags a node needs), `routedcloud` (the cloud driver plugin
the operator Pods use to reach the stub cloud across the namespaces), `monitoring`
(Debian's prometheus scraping the chart's Service), `envs` (what differs between these
namespaces and kind), `scenario` (what `make e2e` does and asserts), `run` (the entry
point) and `chartlint` (`make chart-lint`: helm lint, kubeconform, checkov, hadolint).
`build.sh` builds kubelet, kube-scheduler, kube-proxy and kubeconform; `deps.sh` installs
the Debian packages.
"""
