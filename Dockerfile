# syntax=docker/dockerfile:1
#
# Images of Agent-Reach, built from a clean checkout with Debian's base images
# (deploy/README.md has the commands):
#
#   docker build -t agent-reach .                              the `agent-reach` binary (default target)
#   docker build --target example-agent -t agent-reach-example .   the example agents
#   docker build --target init -t agent-reach-init .           Compose's one-shot secret generator
#
# The service images run as a non-root user on distroless (glibc, no shell, no
# package manager): their health check is `agent-reach healthcheck`, not curl.

# === Build ===
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the
# binaries are copied out of the cached target dir in the same step because a
# cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p agent-reach-cli -p agent-reach-examples \
        --bin agent-reach --bin example-agent \
    && install -D -m 0755 target/release/agent-reach /out/agent-reach \
    && install -D -m 0755 target/release/example-agent /out/example-agent

# === Compose's secret generator (one shot; has a shell on purpose) ===
# Writes the HS256 and callback secrets on first run and fresh tokens on every
# run into a shared volume, owned by the services' user (65532). It runs as
# root only to hand that volume to 65532 (a fresh named volume belongs to
# root); Compose gives it no network and only the chown/file capabilities.
# Nothing long-running runs as root.
FROM debian:bookworm-slim AS init
COPY --from=builder /out/agent-reach /usr/local/bin/agent-reach
COPY deploy/compose/init-secrets.sh /usr/local/bin/init-secrets
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/bin/sh", "/usr/local/bin/init-secrets"]

# === The example agents ===
# agent-reach is in this image too: it is the health check.
FROM gcr.io/distroless/cc-debian12:nonroot AS example-agent
COPY --from=builder /out/example-agent /usr/local/bin/example-agent
COPY --from=builder /out/agent-reach /usr/local/bin/agent-reach
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/example-agent"]
CMD ["--help"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/agent-reach", "healthcheck"]

# === The services: registry, router, context (last stage: the default target) ===
FROM gcr.io/distroless/cc-debian12:nonroot AS agent-reach
COPY --from=builder /out/agent-reach /usr/local/bin/agent-reach
USER 65532:65532
# registry, router, context (their default ports; each binds one of them)
EXPOSE 7400 7500 7600
ENTRYPOINT ["/usr/local/bin/agent-reach"]
CMD ["--help"]
# One image runs three services on different ports, so the URL to probe comes
# from AGENT_REACH_HEALTHCHECK_URL (e.g. http://127.0.0.1:7500/healthz); without
# it the check fails and says so in `docker inspect`.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/agent-reach", "healthcheck"]
