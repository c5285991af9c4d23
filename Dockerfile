# nodewarden operator image. Build it with `make image` (docker where there is a Docker
# engine, podman/buildah elsewhere); see README "Build and publish the image".
#
# The IANA tz database (warm windows, the forecast's hours) comes with the image's Python
# dependencies (the tzdata wheel in requirements.lock; the slim base ships none): the build
# checks that Europe/Berlin resolves.
#
# Reproducible inputs: the base is pinned by Debian point release (pin a digest as well
# when you publish: --build-arg BASE_IMAGE=docker.io/library/debian:12.15-slim@sha256:...),
# and every Python dependency comes from requirements.lock (exact versions + hashes,
# wheels only: no compiler is needed or installed). `make e2e` builds this same file
# with BASE_IMAGE set to a local debootstrap of the same Debian release.
ARG BASE_IMAGE=docker.io/library/debian:12.15-slim

FROM ${BASE_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Debian's python3 of the pinned point release (its security updates included).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.lock ./
RUN python3 -m venv /opt/nodewarden \
    && /opt/nodewarden/bin/pip install --no-cache-dir --no-deps --require-hashes \
        --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
# Only the product: the test doubles (operator/nodewarden_doubles) never enter the image.
COPY operator/nodewarden ./operator/nodewarden
RUN /opt/nodewarden/bin/pip install --no-cache-dir --no-deps --no-build-isolation --no-index . \
    && /opt/nodewarden/bin/pip uninstall --yes setuptools wheel pip \
    && /opt/nodewarden/bin/python -c "import nodewarden.cli" \
    && /opt/nodewarden/bin/python -c "import tzdata, zoneinfo; zoneinfo.ZoneInfo('Europe/Berlin')" \
    && ! /opt/nodewarden/bin/python -c "import nodewarden_doubles" 2>/dev/null

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# python3 (no pip, no compiler); ca-certificates for cloud and BMC TLS.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin nodewarden
COPY --from=build /opt/nodewarden /opt/nodewarden
ENV PATH=/opt/nodewarden/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Runs as a non-root user; works with a read-only root filesystem (the chart mounts an
# emptyDir on /tmp). Ports: 8080 status API, 8081 metrics and probes (chart defaults).
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["nodewarden"]
CMD ["run", "--config=/etc/nodewarden/config.yaml"]
