# gradsync-coordinator image. Build from the repository root:
#   docker build -f docker/coordinator.Dockerfile -t gradsync-coordinator .
FROM debian:12 AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config libuv1-dev libcjson-dev libhttp-parser-dev \
      nanopb libnanopb-dev protobuf-compiler python3-protobuf \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The coordinator alone: no OpenBLAS, zlib, CUDA or check needed (ctest
# coordinator_only_build checks this configuration).
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DGS_BUILD_AGENT=OFF -DGS_BUILD_TESTS=OFF \
    && cmake --build /build -j"$(nproc)" --target gradsync-coordinator

FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      libuv1 libcjson1 libhttp-parser2.9 \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home gradsync
COPY --from=build /build/bin/gradsync-coordinator /usr/local/bin/
USER gradsync
EXPOSE 7070 8080
# Set GRADSYNC_TOKEN in the environment to require a token.
ENTRYPOINT ["gradsync-coordinator"]
CMD ["--listen", ":7070", "--http", ":8080"]
