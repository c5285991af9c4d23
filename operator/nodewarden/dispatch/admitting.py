"""The dispatcher's side of admission that crosses processes (docs/sharding.md section 2,
`fleet.admission`): after its lock write on a ContainerDispatch is acknowledged, the
start reads the chosen WorkerNode's `status.admission` from the API server by a quorum
read (a GET without `resourceVersion`, never the informer cache) and starts the runner
only if it admits the container.

On only when the composition root hands the dispatcher an `ApiAdmission`
(`Dispatcher(admission=...)`, the operator config's cross-process admission switch); off,
the start asks the in-memory power board alone, as a single replica always has.
"""

from __future__ import annotations

from nodewarden.api.kinds import WORKER_NODE
from nodewarden.kube.client import Kube


class ApiAdmission:
    """`fleet.admission.AdmissionReader` over the API server."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.reads = 0

    async def read_admission(self, node: str) -> str | None:
        self.reads += 1
        body = await self.kube.get(WORKER_NODE, self.namespace, node)
        if body is None:
            return None
        value = (body.get("status") or {}).get("admission")
        return str(value) if value is not None else None
