# The pinned cross-toolchain image: `invoke build --target NAME --in docker` runs
# `python -m colibri_kit.build --in host` inside it, with the checkout mounted at /src.
# Docker is a wrapper, not a second build system: the same pins (colibri_kit/toolchain.py),
# the same script, the same bytes as a build on the host.
FROM debian:12-slim

ARG DEBIAN_FRONTEND=noninteractive
# make + git: the build; gcc/libc6-dev: the `host` target; file/binutils: inspection;
# qemu-user + libc6-arm64-cross: the verify step runs aarch64 builds' `colibri --version`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv ca-certificates make git gcc libc6-dev binutils file \
      qemu-user libc6-arm64-cross \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    COLIBRI_CACHE_DIR=/opt/colibri-cache \
    COLIBRI_IN_DOCKER=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python3 -m venv /opt/venv

# The kit (for its Python dependencies) and the toolchain install step: zig + every pinned CUDA
# wheel set, baked into the image so builds inside it need no network.
COPY pyproject.toml README.md /opt/colibri-kit/
COPY colibri_kit /opt/colibri-kit/colibri_kit
RUN pip install /opt/colibri-kit \
 && python -m colibri_kit.toolchain install-all \
 && chmod -R a+rX /opt/colibri-cache

# The checkout is mounted here; `python -m colibri_kit.build` run from /src uses its colibri_kit.
WORKDIR /src
CMD ["python", "-m", "colibri_kit.build", "--help"]
