# syntax=docker/dockerfile:1
# gpu-node-autoscaler: build with `docker build -t gpu-node-autoscaler:0.1.0 .` at the repository
# root (BuildKit). The runtime image holds the binary only and runs as a non-root user.
#
# Multi-arch (linux/amd64 and linux/arm64), one image index:
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/gpu-node-autoscaler:0.1.0 --push .
# Both base images are published for both architectures, and the build stage runs as the target
# platform: cargo compiles natively for it (on a builder of that architecture, or under QEMU
# emulation on another; see docs/operations.md). Nothing here names an architecture.

# The toolchain of the workspace's rust-version (Cargo.toml); Debian 12, like the runtime image,
# so the binary links against the same glibc.
FROM rust:1.94.1-bookworm AS build
ARG TARGETPLATFORM
WORKDIR /src
COPY . .
# Cached registry and target directory speed up rebuilds; the binary is copied out of the cache
# in the same step. The target directory is one per platform: the platforms of a multi-arch build
# run at once, and a shared one would let one copy out the other's binary. The image is the
# controller's (`run`, both clouds) without the simulator: no default features, so neither its
# charts (plotters) nor its progress bars (indicatif) are linked.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=gpu-node-autoscaler-target-$TARGETPLATFORM \
    cargo build --release --locked --bin gpu-node-autoscaler \
        --no-default-features --features controller,alibaba \
    && install -D -m 0755 target/release/gpu-node-autoscaler /out/gpu-node-autoscaler

# glibc and libgcc, CA certificates, no shell or package manager; user nonroot (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpu-node-autoscaler /usr/local/bin/gpu-node-autoscaler
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpu-node-autoscaler"]
CMD ["run"]
