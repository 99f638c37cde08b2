# matmul-server container images.
#
#   docker build -t matmul-server:cuda .               # GPU engine (default target)
#   docker build --target cpu -t matmul-server:cpu .   # CPU engine only
#   docker run --gpus all -p 50051:50051 -p 9090:9090 matmul-server:cuda
#
# Flags go after the image name (docker run IMAGE --max_batch_size=32) or in
# the environment as MATMUL_<FLAG> (-e MATMUL_MAX_BATCH_SIZE=32). The build
# stages install packages with deploy/install-deps.sh from the same lists
# the README's commands use; the runtime stages carry the binaries and
# their shared libraries only (no compiler).

ARG CUDA_VERSION=13.0.0
ARG UBUNTU=ubuntu24.04
ARG MATMUL_BUILD_COMMIT=unknown

# ---- CPU: build ---------------------------------------------------------------
FROM debian:bookworm-slim AS build-cpu
ARG MATMUL_BUILD_COMMIT
COPY deploy/install-deps.sh /src/deploy/install-deps.sh
COPY deploy/deps /src/deploy/deps
RUN /src/deploy/install-deps.sh build
COPY CMakeLists.txt /src/
COPY proto /src/proto
COPY kernels /src/kernels
COPY server /src/server
COPY client /src/client
COPY deploy/collect-runtime.sh /src/deploy/
RUN cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DMATMUL_CUDA=OFF -DMATMUL_BUILD_TESTS=OFF \
        -DMATMUL_BUILD_COMMIT="${MATMUL_BUILD_COMMIT}" \
 && cmake --build /build -j"$(nproc)" --target matmul-server matmul-cli \
 && /src/deploy/collect-runtime.sh /runtime /build/server/matmul-server /build/client/matmul-cli

# ---- CPU: runtime -------------------------------------------------------------
FROM debian:bookworm-slim AS cpu
COPY --from=build-cpu /runtime/ /
RUN ldconfig \
 && groupadd --system --gid 10001 matmul \
 && useradd --system --uid 10001 --gid matmul --home-dir /nonexistent --shell /usr/sbin/nologin matmul
# OPENBLAS_THREAD_TIMEOUT=4: idle BLAS threads sleep at once instead of
# spinning on sched_yield (server CPU per small request -30 to -35%,
# docs/BENCHMARKS.md).
ENV MATMUL_LISTEN=0.0.0.0:50051 \
    MATMUL_METRICS_LISTEN=0.0.0.0:9090 \
    MATMUL_BACKEND=cpu \
    OPENBLAS_THREAD_TIMEOUT=4
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/matmul-server"]

# ---- CUDA: build --------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build-cuda
ARG MATMUL_BUILD_COMMIT
COPY deploy/install-deps.sh /src/deploy/install-deps.sh
COPY deploy/deps /src/deploy/deps
RUN /src/deploy/install-deps.sh build
COPY CMakeLists.txt /src/
COPY proto /src/proto
COPY kernels /src/kernels
COPY server /src/server
COPY client /src/client
COPY deploy/collect-runtime.sh /src/deploy/
RUN cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DMATMUL_CUDA=ON -DMATMUL_BUILD_TESTS=OFF \
        -DMATMUL_BUILD_COMMIT="${MATMUL_BUILD_COMMIT}" \
 && cmake --build /build -j"$(nproc)" --target matmul-server matmul-cli \
 && /src/deploy/collect-runtime.sh /runtime /build/server/matmul-server /build/client/matmul-cli

# ---- CUDA: runtime (the default target) ---------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS cuda
COPY --from=build-cuda /runtime/ /
RUN ldconfig \
 && groupadd --system --gid 10001 matmul \
 && useradd --system --uid 10001 --gid matmul --home-dir /nonexistent --shell /usr/sbin/nologin matmul
ENV MATMUL_LISTEN=0.0.0.0:50051 \
    MATMUL_METRICS_LISTEN=0.0.0.0:9090 \
    MATMUL_BACKEND=auto \
    OPENBLAS_THREAD_TIMEOUT=4 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/matmul-server"]
