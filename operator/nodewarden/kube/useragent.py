"""The User-Agent nodewarden sends to the API server: `nodewarden/<version>` (plus a component).

kubernetes_asyncio puts `ApiClient.default_headers` on every request and lets them win
over per-call `_headers`, so the header is set on the ApiClient itself: every request
made through that client carries it. The API server also derives a write's default
field manager from it (the part before the first `/`).
"""

from __future__ import annotations

from kubernetes_asyncio import client

from nodewarden import __version__

PRODUCT = "nodewarden"


def user_agent(component: str | None = None) -> str:
    """`nodewarden/0.1.0`, or `nodewarden/0.1.0 (informer)` with a component."""
    base = f"{PRODUCT}/{__version__}"
    return f"{base} ({component})" if component else base


def identify(api: client.ApiClient, component: str | None = None) -> client.ApiClient:
    """Set nodewarden's User-Agent on `api` unless it already carries one of nodewarden's."""
    current = str(api.default_headers.get("User-Agent", ""))
    if not current.startswith(f"{PRODUCT}/"):
        api.user_agent = user_agent(component)
    return api
