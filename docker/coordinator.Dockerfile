# gradsync-coordinator image: the control plane, RPC on 7070, HTTP on 8080.
# Build from the repository root (docker or podman; podman needs
# --format docker to keep the HEALTHCHECK):
#   docker build -f docker/coordinator.Dockerfile \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" -t gradsync-coordinator .
# The steps are docker/build.sh's, shared with the agent images.
ARG BASE=docker.io/library/debian:12
ARG RUNTIME_BASE=docker.io/library/debian:12-slim

FROM ${BASE} AS build
COPY docker/build.sh /usr/local/sbin/gradsync-build
RUN gradsync-build build-deps coordinator
COPY . /src
# The coordinator alone: no OpenBLAS, zlib, CUDA or check (ctest
# coordinator_only_build checks this configuration).
RUN gradsync-build compile coordinator

FROM ${RUNTIME_BASE}
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gradsync-coordinator" \
      org.opencontainers.image.description="gradsync control plane: rendezvous, pack list, heartbeats, status over HTTP" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY docker/build.sh /usr/local/sbin/gradsync-build
COPY --from=build /out /out
RUN gradsync-build runtime && cp /out/bin/* /usr/local/bin/ && rm -rf /out /usr/local/sbin/gradsync-build
COPY docker/healthcheck.sh /usr/local/bin/gradsync-healthcheck
USER gradsync
EXPOSE 7070 8080
# GET /healthz over bash's /dev/tcp: bash is already in every Debian image
# (curl would add ~10 MB of libraries for one request). The port follows
# GRADSYNC_HEALTHCHECK_ADDR when --http is moved.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["gradsync-healthcheck"]
# Set GRADSYNC_TOKEN in the environment to require a token (never as a flag:
# flags show in ps).
ENTRYPOINT ["gradsync-coordinator"]
CMD ["--listen", ":7070", "--http", ":8080"]
