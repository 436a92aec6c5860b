# Rendered by `toolbox render` from stack "cuda" (lock 7f77b867a878).
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
      bubblewrap \
      ca-certificates \
      curl \
      diffutils \
      findutils \
      gzip \
      hostname \
      ibverbs-providers \
      ibverbs-utils \
      iproute2 \
      less \
      libibverbs1 \
      librdmacm1 \
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

# ---- devel: compilers for the builder stages (never copied into the runtime) ----
FROM base AS devel
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh debian \
      build-essential \
      ccache \
      cmake \
      git \
      ninja-build \
      patch \
      python3-dev
ENV CCACHE_DIR=/root/.ccache

# ---- llama.cpp @ 0c1e57098bba43ac29e6e3b677cdceebdd22334f (cpu): llama-quantize, llama-perplexity, llama-completion, llama-cli, llama-server, llama-mtmd-cli ----
FROM devel AS llama_cpp-build
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/git-fetch.sh https://github.com/ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f /src/llama.cpp
RUN --mount=type=cache,target=/root/.ccache \
    cmake -S /src/llama.cpp -B /build/llama.cpp -GNinja \
      -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF \
      -DGGML_NATIVE=OFF \
      -DGGML_CCACHE=ON \
      -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_OPENSSL=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_UI=OFF \
 && cmake --build /build/llama.cpp --target llama-quantize llama-perplexity llama-completion llama-cli llama-server llama-mtmd-cli \
 && mkdir -p /opt/llama.cpp/bin \
 && for t in llama-quantize llama-perplexity llama-completion llama-cli llama-server llama-mtmd-cli; do cp /build/llama.cpp/bin/$t /opt/llama.cpp/bin/; done \
 && cp -r /src/llama.cpp/convert_hf_to_gguf.py /src/llama.cpp/conversion /src/llama.cpp/gguf-py /opt/llama.cpp/ \
 && echo "llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (cpu)" > /opt/llama.cpp/VERSION

# ---- runtime: only the builder stages' results; no compilers, no sources ----
FROM base AS runtime

# torch 2.13.0
# (copied, not bind-mounted: the file's content must key the layer cache)
COPY python-lock/torch.txt /opt/toolbox/python-lock/torch.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install \
      --require-hashes --no-deps -r /opt/toolbox/python-lock/torch.txt

# Hugging Face stack and every other package of the stack's Python lock, each file's sha256 checked
COPY python-lock/all.txt /opt/toolbox/python-lock/all.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt

# unsloth 2026.10.9 from PyPI
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install \
      "unsloth==2026.10.9" \
      unsloth_zoo==2026.10.9 \
      accelerate==1.15.0 \
      datasets==4.8.4 \
      peft==0.21.2 \
      transformers==5.17.0 \
      trl==1.15.0 \
      torch==2.13.0 \
      torchvision==0.28.0

# llama.cpp @ 0c1e57098bba43ac29e6e3b677cdceebdd22334f (cpu): programs on PATH (with the OpenMP runtime they link),
# the converter with its own gguf-py (and sentencepiece, which it imports for every Llama model)
COPY --from=llama_cpp-build /opt/llama.cpp/ /opt/llama.cpp/
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh debian libgomp1
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install sentencepiece==0.2.3 \
 && ln -s /opt/llama.cpp/bin/llama-* /usr/local/bin/ \
 && llama-cli --version \
 && llama-mtmd-cli --help >/dev/null \
 && /opt/venv/bin/python /opt/llama.cpp/convert_hf_to_gguf.py --help >/dev/null
ENV LLAMA_CPP_DIR=/opt/llama.cpp

# Ray Train (launch --launcher ray) and what only it pulls in, from the stack's Python lock: a layer
# of its own so the training stack's layers above are shared with a ray bump
COPY python-lock/ray.txt /opt/toolbox/python-lock/ray.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --require-hashes --no-deps -r /opt/toolbox/python-lock/ray.txt

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
    io.github.toolbox.llama_cpp.backend="cpu" \
    io.github.toolbox.llama_cpp.commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f" \
    io.github.toolbox.llama_cpp.sentencepiece="0.2.3" \
    io.github.toolbox.llama_cpp.source="git" \
    io.github.toolbox.lock-digest="7f77b867a878" \
    io.github.toolbox.peft.version="0.21.2" \
    io.github.toolbox.platform="cuda" \
    io.github.toolbox.python.lock.sha256="e1f412a0a1ceed9884120ac33f11a90a12dce179301eeeb87a953efe62ae7acb" \
    io.github.toolbox.python.lock.torch.sha256="5d5ed9c915affa412002d6c4808f9c07fff52fddb0c8d8500a65f3ba64d9deb6" \
    io.github.toolbox.ray.version="2.60.0" \
    io.github.toolbox.stack="cuda" \
    io.github.toolbox.torch.version="2.13.0" \
    io.github.toolbox.torchvision.version="0.28.0" \
    io.github.toolbox.transformers.version="5.17.0" \
    io.github.toolbox.trl.version="1.15.0" \
    io.github.toolbox.unsloth.version="2026.10.9" \
    io.github.toolbox.unsloth_zoo.version="2026.10.9" \
    org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim" \
    org.opencontainers.image.description="LLM fine-tuning toolbox for NVIDIA GPUs (CUDA)" \
    org.opencontainers.image.licenses="Apache-2.0" \
    org.opencontainers.image.source="https://github.com/toolbox/toolbox" \
    org.opencontainers.image.title="toolbox-cuda" \
    org.opencontainers.image.vendor="toolbox" \
    org.opencontainers.image.version="7f77b867a878"
