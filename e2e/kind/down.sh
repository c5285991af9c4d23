#!/usr/bin/env bash
# Delete the kind cluster made by e2e/kind/up.sh.
set -euo pipefail
kind delete cluster --name "${KIND_CLUSTER:-nodewarden}"
