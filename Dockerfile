# syntax=docker/dockerfile:1
# Two images from one file (see README.md, "Container images"):
#
#   docker build --target controlplane -t pdplane:TAG .        # the default target
#   docker build --target agent        -t pdplane-agent:TAG .
#
# controlplane: pdplane alone on distroless (glibc, CA certificates, no
#   shell), for `pdplane serve` and `pdplane migrate`. No NIXL: the control
#   plane and the router never move KV bytes.
# agent: pdplane on Debian slim with NIXL's C libraries (libnixl_capi.so,
#   the UCX plugin, UCX) beside it, for `pdplane agent` on engine hosts and
#   `pdplane sim --transfer nixl`. It keeps a shell: --heal exec:CMD runs
#   /bin/sh.
#
# pdplane is built with CGO_ENABLED=0, but purego makes it a dynamically
# linked executable (it dlopens libnixl_capi.so through ld.so), so both
# images need glibc: no scratch, no static distroless, no musl/alpine.
#
# Base images are pinned by tag, not digest: the digests could not be looked
# up where this file was written. Pin them with
#   docker buildx imagetools inspect IMAGE:TAG
# and FROM IMAGE:TAG@sha256:... for byte-for-byte rebuilds.
# deploy/dockerfile_test.go checks this file offline (targets, users,
# HEALTHCHECK, NIXL paths, that the commands are real pdplane subcommands,
# and hadolint when installed).

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/pdplane ./cmd/pdplane

# NIXL's C libraries, taken out of the nixl-cu12 wheel: installed without its
# Python dependencies (torch), then scripts/nixl-runtime-libs.sh copies only
# libnixl_capi.so, the UCX plugin, UCX and what they link (by ldd), in the
# wheel's two-folder layout that their RPATHs expect. The build fails here
# if the library or the plugin is not where the agent stage points.
FROM python:3.12-slim-bookworm AS nixl
ARG NIXL_VERSION=1.5.1
COPY scripts/nixl-runtime-libs.sh /usr/local/bin/nixl-runtime-libs.sh
RUN set -eux; \
    python -m venv /opt/nixl-venv; \
    /opt/nixl-venv/bin/pip install --no-cache-dir --no-deps "nixl-cu12==${NIXL_VERSION}"; \
    site=$(/opt/nixl-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    bash /usr/local/bin/nixl-runtime-libs.sh "$site" /opt/nixl; \
    test -f /opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so; \
    test -f /opt/nixl/.nixl_cu12.mesonpy.libs/plugins/libplugin_UCX.so

# The engine-host image: `pdplane agent` (CMD), or any subcommand.
FROM debian:bookworm-slim AS agent
# libssl3, libstdc++6 and zlib1g are what libnixl_capi.so links from the
# system; versions follow the bookworm tag.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 libstdc++6 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 pdplane \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin pdplane \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/pdplane
COPY --from=nixl /opt/nixl /opt/nixl
COPY --from=build /out/pdplane /usr/local/bin/pdplane
ENV PDPLANE_NIXL_LIB=/opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so \
    NIXL_PLUGIN_DIR=/opt/nixl/.nixl_cu12.mesonpy.libs/plugins
# The agent serves no HTTP: its liveness is its lease at the control plane.
HEALTHCHECK NONE
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/pdplane"]
CMD ["agent"]

# The control-plane image, last so that a plain `docker build .` makes it.
# User 10001 is the one deploy/kubernetes runs as.
FROM gcr.io/distroless/base-debian12:nonroot AS controlplane
COPY --from=build /out/pdplane /usr/local/bin/pdplane
ENV PDPLANE_ADDR=0.0.0.0:8080
USER 10001:10001
EXPOSE 8080
# No shell or curl here: the binary probes its own /healthz (port from
# PDPLANE_ADDR).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/pdplane", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/pdplane"]
CMD ["serve"]
