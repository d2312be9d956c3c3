# gradsync agent image, CPU (OpenBLAS): gradsync-agent, gradsync-run and
# gradsync-coordinator (for single-machine gradsync-run). Build from the
# repository root (podman: add --format docker):
#   docker build -f docker/agent.Dockerfile --build-arg WITH_DATA=1 \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" -t gradsync-agent .
# WITH_DATA=1 adds Debian's dataset-fashion-mnist (the demo's data, ~30 MB)
# at the agent's default --data path; without it, mount your IDX files there.
# docker/agent-cuda.Dockerfile is this file with CUDA bases: keep them alike.
ARG BASE=docker.io/library/debian:12
ARG RUNTIME_BASE=docker.io/library/debian:12-slim

FROM ${BASE} AS build
COPY docker/build.sh /usr/local/sbin/gradsync-build
RUN gradsync-build build-deps agent
COPY . /src
RUN gradsync-build compile agent

FROM ${RUNTIME_BASE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG WITH_DATA=0
LABEL org.opencontainers.image.title="gradsync-agent" \
      org.opencontainers.image.description="gradsync agent (CPU, OpenBLAS): one training rank, and the gradsync-run launcher" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY docker/build.sh /usr/local/sbin/gradsync-build
COPY --from=build /out /out
RUN if [ "$WITH_DATA" = 1 ]; then data=--data; else data=; fi \
    && gradsync-build runtime $data && cp /out/bin/* /usr/local/bin/ \
    && rm -rf /out /usr/local/sbin/gradsync-build
USER gradsync
# Agents take their settings from GRADSYNC_* variables (or flags): at least
# GRADSYNC_COORDINATOR, GRADSYNC_WORLD_SIZE, and GRADSYNC_TOKEN when the
# coordinator requires one.
ENTRYPOINT ["gradsync-agent"]
