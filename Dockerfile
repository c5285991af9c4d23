# nodewarden operator image. Build: docker build -t nodewarden:0.1.0 .
# (Not built in this repository's CI: the development machines have no Docker engine.)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
# openssh-client is not needed (asyncssh is pure Python); ca-certificates for BMC/cloud TLS.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin nodewarden
COPY --from=build /install /usr/local
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["nodewarden"]
CMD ["run", "--config=/etc/nodewarden/config.yaml"]
