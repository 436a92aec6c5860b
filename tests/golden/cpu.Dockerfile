# Rendered by `toolbox render` from stack "cpu" (lock b9dcd4ff7c27).
# Edit the stack (toolbox/stacks/) or the templates (dockerfiles/), not this file.
# Build inputs: optional secret `ca` (a CA bundle), context folder `wheelhouse/` (find-links).

# ---- base: docker.io/library/debian:bookworm-slim, toolbx/distrobox packages, Python venv at /opt/venv ----
FROM docker.io/library/debian:bookworm-slim AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/ /opt/toolbox/scripts/
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh debian \
      bash \
      bc \
      ca-certificates \
      curl \
      diffutils \
      findutils \
      gzip \
      hostname \
      iproute2 \
      less \
      lsof \
      passwd \
      pinentry-curses \
      procps \
      python3 \
      python3-venv \
      sudo \
      tar \
      time \
      util-linux \
      wget \
      xz-utils
RUN python3 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY scripts/profile.sh /etc/profile.d/toolbox-image.sh

# ---- runtime: only the builder stages' results; no compilers, no sources ----
FROM base AS runtime

# torch 2.13.0+cpu from https://download.pytorch.org/whl/cpu
# (copied, not bind-mounted: the file's content must key the layer cache)
COPY python-lock/torch.txt /opt/toolbox/python-lock/torch.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install \
      --torch-index https://download.pytorch.org/whl/cpu \
      --require-hashes --no-deps -r /opt/toolbox/python-lock/torch.txt

# Hugging Face stack and every other package of the stack's Python lock, each file's sha256 checked
COPY python-lock/all.txt /opt/toolbox/python-lock/all.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt

# the training entrypoints (finetune, launch, rccl-check); then every installed requirement must hold;
# then the venv's commands into /usr/local/bin, where toolbx/distrobox shells (host PATH) look
COPY entrypoints/ /opt/toolbox/entrypoints/
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --no-deps /opt/toolbox/entrypoints \
 && /opt/toolbox/scripts/pip.sh check \
 && /opt/toolbox/scripts/link-venv.sh
COPY stack.lock.yaml /opt/toolbox/stack.lock.yaml

LABEL \
    com.github.containers.toolbox="true" \
    io.github.toolbox.accelerate.version="1.15.0" \
    io.github.toolbox.base.image="docker.io/library/debian:bookworm-slim" \
    io.github.toolbox.datasets.version="4.8.4" \
    io.github.toolbox.lock-digest="b9dcd4ff7c27" \
    io.github.toolbox.peft.version="0.21.2" \
    io.github.toolbox.platform="cpu" \
    io.github.toolbox.python.lock.sha256="d44c47401a0306520b20bdf410661a920c67d731d8266473e4bae0b34761ea65" \
    io.github.toolbox.python.lock.torch.sha256="c05c6f1f8b39ee8a11998189d9115ca8d8f6fe4dcb98e439681dacd5a988c505" \
    io.github.toolbox.stack="cpu" \
    io.github.toolbox.torch.index_url="https://download.pytorch.org/whl/cpu" \
    io.github.toolbox.torch.version="2.13.0+cpu" \
    io.github.toolbox.transformers.version="5.17.0" \
    io.github.toolbox.trl.version="1.15.0" \
    org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim" \
    org.opencontainers.image.description="LLM fine-tuning toolbox, CPU build (HF backend)" \
    org.opencontainers.image.licenses="Apache-2.0" \
    org.opencontainers.image.source="https://github.com/toolbox/toolbox" \
    org.opencontainers.image.title="toolbox-cpu" \
    org.opencontainers.image.vendor="toolbox" \
    org.opencontainers.image.version="b9dcd4ff7c27"
