#!/usr/bin/env bash
# The `make e2e` scenario and assertions on a kind cluster, for hosts with Docker.
# Cannot run on the development machines (no Docker engine); not run by CI.
#   sudo e2e/kind/e2e.sh [--trimmed]    # needs docker, kind, kubectl, root, and `make install`
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
exec "$repo/.venv/bin/python" "$here/kindenv.py" "$@"
