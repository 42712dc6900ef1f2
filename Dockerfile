# syntax=docker/dockerfile:1
# pdplane: one static-free Go binary on a glibc base. purego loads
# libnixl_capi.so through the dynamic loader at run time, so the runtime image
# must have glibc and ld.so (no scratch, no musl/alpine).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pdplane ./cmd/pdplane

# NIXL (optional at run time): the nixl-cu12 wheel ships libnixl_capi.so, the
# UCX plugin and UCX itself. Installed into a venv and copied as plain files.
FROM python:3.12-slim-bookworm AS nixl
RUN python -m venv /opt/nixl-venv && /opt/nixl-venv/bin/pip install --no-cache-dir nixl-cu12==1.5.1 \
 && mkdir -p /opt/nixl \
 && lib=$(find /opt/nixl-venv -name 'libnixl_capi.so*' | head -n 1) \
 && cp -a "$(dirname "$lib")"/. /opt/nixl/ \
 && plugin=$(find /opt/nixl-venv -name 'libplugin_UCX*.so' | head -n 1) \
 && mkdir -p /opt/nixl/plugins && cp -a "$(dirname "$plugin")"/. /opt/nixl/plugins/ \
 && ln -sf "$(basename "$lib")" /opt/nixl/libnixl_capi.so.0 || true

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /nonexistent --shell /usr/sbin/nologin pdplane
COPY --from=build /out/pdplane /usr/local/bin/pdplane
COPY --from=nixl /opt/nixl /opt/nixl
ENV PDPLANE_NIXL_LIB=/opt/nixl/libnixl_capi.so.0 \
    NIXL_PLUGIN_DIR=/opt/nixl/plugins \
    LD_LIBRARY_PATH=/opt/nixl \
    PDPLANE_ADDR=0.0.0.0:8080
USER pdplane
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/pdplane"]
CMD ["serve"]
