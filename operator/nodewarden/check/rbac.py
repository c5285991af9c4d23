"""Check that the operator's identity holds every permission it uses (access reviews).

The permissions are `nodewarden.kube.permissions.REQUIRED_PERMISSIONS` -- the table the
chart's Role is made of -- with the placeholders filled from the operator config
(``<lease>`` = ``nodewarden-<dispatcherId>``). For the current user each one is asked
with a SelfSubjectAccessReview; for a ServiceAccount (``--as-serviceaccount``) with a
SubjectAccessReview, or a namespaced LocalSubjectAccessReview when the caller may not
create cluster-wide reviews. `reviews` and `rbac_result` are pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nodewarden.check.result import CheckResult, failed, names, passed, warned
from nodewarden.config import OperatorConfig
from nodewarden.kube.permissions import REQUIRED_PERMISSIONS, SHARDING_PERMISSIONS, Permission

CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class Review:
    """One question to the API server: may the subject do `verb` on this resource?"""

    group: str
    resource: str
    subresource: str
    verb: str
    namespace: str
    name: str = ""

    def describe(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        if self.group:
            what += f".{self.group}"
        return f"{self.verb} {what}" + (f" ({self.name})" if self.name else "")

    def attributes(self) -> client.V1ResourceAttributes:
        return client.V1ResourceAttributes(
            group=self.group,
            resource=self.resource,
            subresource=self.subresource or None,
            verb=self.verb,
            namespace=self.namespace,
            name=self.name or None,
        )


def placeholders(config: OperatorConfig) -> dict[str, str | None]:
    return {
        "<lease>": config.lease_name,
        "<status-token>": config.management.token_secret_name,
    }


def reviews(
    config: OperatorConfig,
    namespace: str,
    permissions: Sequence[Permission] = REQUIRED_PERMISSIONS,
    secret_names: Iterable[str] = (),
) -> list[Review]:
    """The reviews that prove every permission. `get secrets` is asked per Secret the
    operator will read when their names are known (a Role may narrow it to them)."""
    fill = placeholders(config)
    secrets = sorted(set(secret_names))
    out: list[Review] = []
    for perm in permissions:
        resource, _, sub = perm.resource.partition("/")
        named = [fill.get(n, n) for n in perm.resource_names]
        if perm.group == "" and resource == "secrets" and not named and secrets:
            named = list(secrets)
        for verb in perm.verbs:
            for name in [n for n in named if n] or [""]:
                out.append(Review(perm.group, resource, sub, verb, namespace, name))
    return out


def rbac_result(subject: str, denied: Sequence[Review], total: int) -> CheckResult:
    if not denied:
        return passed("rbac", f"{subject} holds all {total} permissions the operator uses")
    return failed(
        "rbac",
        f"{subject} lacks {len(denied)} of {total} permissions the operator uses: "
        f"{names((r.describe() for r in denied), 8)}",
        "grant them: helm upgrade the chart (its Role is made of this list), or add them to "
        "the Role bound to the operator (kubectl auth can-i --list --as ... shows what it has)",
    )


def service_account_user(namespace: str, name: str) -> tuple[str, list[str]]:
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    )


class _Asker:
    """Sends reviews for one subject; remembers whether cluster-wide reviews are allowed."""

    def __init__(self, api: client.ApiClient, service_account: str | None, namespace: str):
        self.authz = client.AuthorizationV1Api(api)
        self.service_account = service_account
        self.namespace = namespace
        self.local_only = False

    async def allowed(self, review: Review) -> bool:
        if self.service_account is None:
            own = await self.authz.create_self_subject_access_review(
                client.V1SelfSubjectAccessReview(
                    spec=client.V1SelfSubjectAccessReviewSpec(
                        resource_attributes=review.attributes()
                    )
                )
            )
            return bool(own.status.allowed)
        user, groups = service_account_user(self.namespace, self.service_account)
        spec = client.V1SubjectAccessReviewSpec(
            user=user, groups=groups, resource_attributes=review.attributes()
        )
        if not self.local_only:
            try:
                answer = await self.authz.create_subject_access_review(
                    client.V1SubjectAccessReview(spec=spec)
                )
                return bool(answer.status.allowed)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                self.local_only = True
        local = await self.authz.create_namespaced_local_subject_access_review(
            review.namespace, client.V1LocalSubjectAccessReview(spec=spec)
        )
        return bool(local.status.allowed)


async def check_rbac(
    api: client.ApiClient,
    config: OperatorConfig,
    namespace: str,
    service_account: str | None,
    secret_names: Iterable[str] = (),
) -> list[CheckResult]:
    table = REQUIRED_PERMISSIONS + (SHARDING_PERMISSIONS if config.sharding.enabled else ())
    asked = reviews(config, namespace, table, secret_names=secret_names)
    asker = _Asker(api, service_account, namespace)
    subject = (
        f"ServiceAccount {namespace}/{service_account}" if service_account else "the current user"
    )
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(review: Review) -> bool:
        async with gate:
            return await asker.allowed(review)

    try:
        answers = await asyncio.gather(*(one(r) for r in asked))
    except ApiException as exc:
        return [
            warned(
                "rbac",
                f"cannot ask the API server about {subject}'s permissions: HTTP {exc.status} "
                f"{exc.reason}",
                "run check as a user who may create subjectaccessreviews (or "
                "localsubjectaccessreviews in the namespace)",
            )
        ]
    denied = [r for r, ok in zip(asked, answers, strict=True) if not ok]
    result = rbac_result(subject, denied, len(asked))
    if service_account is None and result.status.value == "pass":
        result = passed(
            "rbac",
            f"{result.message} (the operator's own ServiceAccount: --as-serviceaccount NAME)",
        )
    return [result]
