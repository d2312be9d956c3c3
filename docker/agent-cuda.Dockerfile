# gradsync agent image, CUDA (cuBLAS + NCCL) with the CPU path too: the same
# steps as docker/agent.Dockerfile (both RUN docker/build.sh) on NVIDIA's
# CUDA images, Ubuntu 24.04 based (NVIDIA publishes no Debian ones): the
# devel image to compile (nvcc, libnccl-dev), the runtime image (cudart,
# cuBLAS, libnccl2) to run. Build where docker.io/nvidia/cuda can be pulled,
# from the repository root:
#   docker build -f docker/agent-cuda.Dockerfile --build-arg WITH_DATA=1 \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" -t gradsync-agent-cuda .
# (podman: add --format docker). Run with the NVIDIA Container Toolkit:
# docker run --gpus all ...  or  podman run --device nvidia.com/gpu=all ...
# The default CUDA architectures are sm_80 and sm_90 plus PTX
# (CMakeLists.txt); pin another tag with --build-arg BASE=... RUNTIME_BASE=...
# where the host's driver is older than CUDA 12.6.
ARG BASE=docker.io/nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG RUNTIME_BASE=docker.io/nvidia/cuda:12.6.3-runtime-ubuntu24.04

FROM ${BASE} AS build
COPY docker/build.sh /usr/local/sbin/gradsync-build
RUN gradsync-build build-deps agent
COPY . /src
RUN gradsync-build compile agent

FROM ${RUNTIME_BASE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG WITH_DATA=0
LABEL org.opencontainers.image.title="gradsync-agent-cuda" \
      org.opencontainers.image.description="gradsync agent (CUDA: cuBLAS, NCCL; CPU: OpenBLAS): one training rank, and the gradsync-run launcher" \
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
