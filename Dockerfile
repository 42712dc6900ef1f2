# syntax=docker/dockerfile:1
# pdplane: one Go binary (no cgo) on a glibc base. purego loads
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
# UCX plugin and UCX itself. Only the C libraries are needed, so the wheel is
# installed without its Python dependencies (torch) and its two library
# folders are copied as they are: their RPATHs point at each other.
FROM python:3.12-slim-bookworm AS nixl
RUN set -eux; \
    python -m venv /opt/nixl-venv; \
    /opt/nixl-venv/bin/pip install --no-cache-dir --no-deps nixl-cu12==1.5.1; \
    site=$(/opt/nixl-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    mkdir -p /opt/nixl; \
    cp -a "$site/.nixl_cu12.mesonpy.libs" "$site/nixl_cu12.libs" /opt/nixl/; \
    test -f /opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so; \
    test -f /opt/nixl/.nixl_cu12.mesonpy.libs/plugins/libplugin_UCX.so

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home /nonexistent --shell /usr/sbin/nologin pdplane
COPY --from=build /out/pdplane /usr/local/bin/pdplane
COPY --from=nixl /opt/nixl /opt/nixl
ENV PDPLANE_NIXL_LIB=/opt/nixl/.nixl_cu12.mesonpy.libs/libnixl_capi.so \
    NIXL_PLUGIN_DIR=/opt/nixl/.nixl_cu12.mesonpy.libs/plugins \
    PDPLANE_ADDR=0.0.0.0:8080
USER pdplane
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/pdplane"]
CMD ["serve"]
