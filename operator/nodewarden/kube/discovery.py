"""Are nodewarden's CRDs installed? Asked through API discovery (no cluster-wide read).

`GET /apis/nodewarden.io/v1alpha1` lists the resources the API server serves for the
group version; every authenticated user may read discovery, so neither the operator nor
`nodewarden check` needs to read CustomResourceDefinitions to know which kinds exist.

- `served_resources(api)`   -> the served resource names ("workernodes", "workernodes/status", ...)
                               or None when the group version is not served at all;
- `missing_crds(api)`       -> the CRD names (``workernodes.nodewarden.io``) not served;
- `wait_for_crds(api, stop)` -> the operator's start-up gate: one clear log line naming
                               what is missing and the command that installs it, then a
                               quiet poll until every CRD is served (or `stop` is set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import MutableMapping

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.api.base import GROUP, VERSION
from nodewarden.api.kinds import ALL_KINDS
from nodewarden.kube.kubeconfig import one_line

log = logging.getLogger(__name__)

INSTALL_CRDS = (
    "kubectl apply --server-side -f crds/ (the CRDs of this nodewarden release; "
    "`nodewarden crds DIR` writes them) or helm install/upgrade the chart"
)
WAITING_KEY = "waitingFor"


class DiscoveryError(Exception):
    """The API server did not answer the discovery request (not a 404)."""


async def served_resources(
    api: client.ApiClient, group: str = GROUP, version: str = VERSION
) -> set[str] | None:
    """Resource names served for `group/version` (subresources as "plural/sub"); None if
    the group version is not served. DiscoveryError when the API server did not answer."""
    try:
        listing = await client.CustomObjectsApi(api).get_api_resources(group, version)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise DiscoveryError(
            f"GET /apis/{group}/{version}: HTTP {exc.status} {exc.reason}"
        ) from None
    except (OSError, TimeoutError, aiohttp.ClientError) as exc:
        raise DiscoveryError(
            f"GET /apis/{group}/{version}: {one_line(str(exc)) or exc!r}"
        ) from None
    return {str(r.name) for r in (listing.resources or [])}


async def missing_crds(api: client.ApiClient) -> list[str]:
    """The names of nodewarden's CRDs the API server does not serve (empty: all there)."""
    served = await served_resources(api) or set()
    return [kind.crd_name for kind in ALL_KINDS if kind.plural not in served]


async def wait_for_crds(
    api: client.ApiClient,
    stop: asyncio.Event,
    notes: MutableMapping[str, str] | None = None,
    *,
    interval: float = 5.0,
) -> bool:
    """Return True once every CRD is served, False if `stop` is set first.

    Logs one ERROR line naming the missing CRDs and the install command (again only when
    the set changes) and one WARNING when the API server cannot be asked; `notes` (the
    /readyz body) says what the process waits for meanwhile.
    """
    reported: object = None
    while not stop.is_set():
        try:
            missing = await missing_crds(api)
        except DiscoveryError as exc:
            if reported != "unreachable":
                log.warning("cannot ask the API server which CRDs it serves: %s; retrying", exc)
                reported = "unreachable"
            if notes is not None:
                notes[WAITING_KEY] = "the API server"
        else:
            if not missing:
                if notes is not None:
                    notes.pop(WAITING_KEY, None)
                if reported is not None:
                    log.info("nodewarden's CRDs are installed; starting")
                return True
            if reported != missing:
                log.error(
                    "CRDs not installed: %s; install them: %s. Not ready until they are served.",
                    ", ".join(missing),
                    INSTALL_CRDS,
                    extra={"missing_crds": missing},
                )
                reported = missing
            else:
                log.debug("still waiting for CRDs: %s", ", ".join(missing))
            if notes is not None:
                notes[WAITING_KEY] = "CRDs " + ", ".join(missing)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
    return False
