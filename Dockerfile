# syntax=docker/dockerfile:1
# isthmus images for people who build with Docker. Without Docker, `make images` (e2e/images/build) builds the
# same three images as OCI archives: same static binaries, paths, users and entrypoints.
#
#   docker build --target operator -t localhost/isthmus-operator:0.1.0 .
#   docker build --target agent    -t localhost/isthmus-agent:0.1.0 .
#   docker build --target probe    -t localhost/isthmus-probe:0.1.0 .

ARG RUST_VERSION=1.95
ARG BASE=gcr.io/distroless/static-debian12

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Static glibc binaries (crt-static); --target keeps the flag off build scripts and proc-macros.
ENV RUSTFLAGS="-C target-feature=+crt-static" \
    CARGO_TARGET_DIR=/src/target/static
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target/static \
    cargo build --release --locked --target x86_64-unknown-linux-gnu --bins \
        -p isthmus-operator -p isthmus-agent -p isthmus-probe \
 && mkdir -p /out \
 && cp target/static/x86_64-unknown-linux-gnu/release/isthmus-operator \
       target/static/x86_64-unknown-linux-gnu/release/isthmus-agent \
       target/static/x86_64-unknown-linux-gnu/release/isthmus-probe /out/

# Operator: non-root (distroless's nonroot user, 65532:65532), like `e2e/images/build operator`.
FROM ${BASE} AS operator
COPY --from=build /out/isthmus-operator /usr/local/bin/isthmus-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/isthmus-operator"]

# Probe alone, for test pods: echo server and bulk sink by default.
FROM ${BASE} AS probe
COPY --from=build /out/isthmus-probe /usr/local/bin/isthmus-probe
ENTRYPOINT ["/usr/local/bin/isthmus-probe"]
CMD ["serve"]

# Agent (last, so a plain `docker build .` gives it): root, because it enters pod network namespaces; the chart
# grants it only the capabilities it needs. The probe rides along for measurements from the node.
FROM ${BASE} AS agent
COPY --from=build /out/isthmus-agent /usr/local/bin/isthmus-agent
COPY --from=build /out/isthmus-probe /usr/local/bin/isthmus-probe
ENTRYPOINT ["/usr/local/bin/isthmus-agent"]
