# Rendered by `toolbox render` from stack "gfx1151" (lock 7ebaa487873c).
# Edit the stack (toolbox/stacks/) or the templates (dockerfiles/), not this file.
# Build inputs: optional secret `ca` (a CA bundle), context folder `wheelhouse/` (find-links).

# ---- base: registry.fedoraproject.org/fedora:43, toolbx/distrobox packages, Python venv at /opt/venv ----
FROM registry.fedoraproject.org/fedora:43 AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/ /opt/toolbox/scripts/
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh fedora \
      bash \
      bc \
      bubblewrap \
      ca-certificates \
      curl \
      diffutils \
      findutils \
      gzip \
      hostname \
      iproute \
      less \
      libatomic \
      libibverbs \
      libibverbs-utils \
      librdmacm \
      lsof \
      numactl-libs \
      passwd \
      pinentry \
      procps-ng \
      python3.12 \
      shadow-utils \
      sudo \
      tar \
      time \
      util-linux \
      wget \
      which \
      xz
RUN python3.12 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY scripts/profile.sh /etc/profile.d/toolbox-image.sh

# ---- rocm: TheRock 7.13.0 dist tarball for gfx1151: sha256 and layout checked ----
FROM base AS rocm-fetch
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/fetch-archive.sh \
      --url https://repo.amd.com/rocm/tarball/therock-dist-linux-gfx1151-7.13.0.tar.gz \
      --sha256 UNVERIFIED \
      --dest /opt/rocm \
      --expect bin/hipcc \
      --expect bin/rocminfo \
      --expect lib/libamdhip64.so \
      --expect share/therock/therock_manifest.json

# ---- devel: compilers for the builder stages (never copied into the runtime) ----
FROM base AS devel
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh fedora \
      ccache \
      cmake \
      gcc-c++ \
      git-core \
      make \
      ninja-build \
      patch \
      python3-devel
COPY --from=rocm-fetch /opt/rocm /opt/rocm
ENV ROCM_PATH=/opt/rocm \
    HIP_PATH=/opt/rocm \
    PATH=/opt/rocm/bin:/opt/rocm/llvm/bin:$PATH \
    LD_LIBRARY_PATH=/opt/rocm/lib
ENV CCACHE_DIR=/root/.ccache

# ---- rccl: https://github.com/ROCm/rocm-systems @ 79e85e1468f96a867108043c953e9547c13b4c5e (projects/rccl), patch series rccl-patches/gfx1151, for gfx1151 ----
FROM devel AS rccl-build
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/git-fetch.sh https://github.com/ROCm/rocm-systems 79e85e1468f96a867108043c953e9547c13b4c5e /src/rocm-systems
COPY rccl-patches/ /src/rccl-patches/
RUN /opt/toolbox/scripts/apply-patches.sh /src/rocm-systems --series /src/rccl-patches/gfx1151
# RCCL comes from the sources of the ROCm torch was built against: the tarball's TheRock manifest
# must name this rocm-systems commit (checked here too, as a pinned sha256 skips the first-use check).
RUN /opt/venv/bin/python -c 'import json; subs = json.load(open("/opt/rocm/share/therock/therock_manifest.json")).get("submodules") or []; \
got = {s.get("commit") for s in subs if "rocm-systems" in (str(s.get("path", "")).rstrip("/").rsplit("/", 1)[-1], str(s.get("url", "")).rstrip("/").removesuffix(".git").rsplit("/", 1)[-1])}; \
assert got <= {"79e85e1468f96a867108043c953e9547c13b4c5e"}, f"the ROCm tarball was built from rocm-systems {got}, rccl.commit is 79e85e1468f96a867108043c953e9547c13b4c5e"; print("rocm-systems:", got or "not named")'
RUN --mount=type=cache,target=/root/.ccache \
    cmake -S /src/rocm-systems/projects/rccl -B /build/rccl -GNinja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/opt/rccl \
      -DCMAKE_CXX_COMPILER=/opt/rocm/bin/amdclang++ \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DROCM_PATH=/opt/rocm \
      -DEXPLICIT_ROCM_VERSION=7.13.0 \
      -DGPU_TARGETS="gfx1151" \
      -DBUILD_TESTS=OFF \
      -DGENERATE_SYM_KERNELS=OFF \
      -DENABLE_AMDSMI=OFF \
      -DFAULT_INJECTION=OFF \
 && cmake --build /build/rccl \
 && cmake --install /build/rccl
RUN --mount=type=cache,target=/root/.ccache \
    cmake -S /src/rocm-systems/projects/rccl-tests -B /build/rccl-tests -GNinja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/opt/rccl \
      -DCMAKE_PREFIX_PATH="/opt/rccl;/opt/rocm" \
      -DCMAKE_CXX_COMPILER=/opt/rocm/bin/amdclang++ \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DROCM_PATH=/opt/rocm \
      -DGPU_TARGETS="gfx1151" \
 && cmake --build /build/rccl-tests \
 && cmake --install /build/rccl-tests

# ---- bitsandbytes 0.50.1 @ 37d2a9387f7146ccb85517ff45c665d345bfda79: HIP backend for gfx1151, against this image's ROCm ----
# scripts/build-bitsandbytes.sh: cmake with these flags, the library named for the HIP hipconfig
# reports (libbitsandbytes_rocm<major><minor>.so), then the wheel; the host test
# tests/test_bnb_source.py runs the same script on the same commit (CPU backend).
FROM devel AS bitsandbytes-build
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/git-fetch.sh https://github.com/bitsandbytes-foundation/bitsandbytes 37d2a9387f7146ccb85517ff45c665d345bfda79 /src/bitsandbytes
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.ccache \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    HIPCXX=/opt/rocm/llvm/bin/clang++ CMAKE_HIP_COMPILER_LAUNCHER=ccache \
    BNB_BUILD_DIR=/build/bitsandbytes PIP=/opt/toolbox/scripts/pip.sh \
    /opt/toolbox/scripts/build-bitsandbytes.sh /src/bitsandbytes /wheels/bitsandbytes \
      -DCOMPUTE_BACKEND=hip -DBNB_ROCM_ARCH="gfx1151"

# ---- llama.cpp @ 0c1e57098bba43ac29e6e3b677cdceebdd22334f (hip): llama-quantize, llama-perplexity, llama-completion, llama-cli, llama-server, llama-mtmd-cli ----
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
      -DGGML_HIP=ON \
      -DGPU_TARGETS="gfx1151" \
      -DCMAKE_HIP_COMPILER=/opt/rocm/llvm/bin/clang \
 && cmake --build /build/llama.cpp --target llama-quantize llama-perplexity llama-completion llama-cli llama-server llama-mtmd-cli \
 && mkdir -p /opt/llama.cpp/bin \
 && for t in llama-quantize llama-perplexity llama-completion llama-cli llama-server llama-mtmd-cli; do cp /build/llama.cpp/bin/$t /opt/llama.cpp/bin/; done \
 && cp -r /src/llama.cpp/convert_hf_to_gguf.py /src/llama.cpp/conversion /src/llama.cpp/gguf-py /opt/llama.cpp/ \
 && echo "llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (hip)" > /opt/llama.cpp/VERSION

# ---- runtime: only the builder stages' results; no compilers, no sources ----
FROM base AS runtime

# rocm 7.13.0
COPY --from=rocm-fetch /opt/rocm /opt/rocm
# /opt/rocm/lib is in the loader's cache, not on LD_LIBRARY_PATH: LD_LIBRARY_PATH comes
# before a library's own RUNPATH, so there it would hand the rocm-sdk HIP torch loads this ROCm's HSA
# runtime and COMGR (two builds in one process: the 10.0.0 tarball's COMGR link error, TheRock #7426).
# From the cache, programs built here (llama.cpp, rccl-tests) still find it, and torch's SDK its own.
RUN echo /opt/rocm/lib > /etc/ld.so.conf.d/toolbox-rocm.conf && ldconfig
# AOTriton's flash/efficient attention is experimental on RDNA and off without the variable: torch
# falls back to the MATH kernel, ~19x slower on gfx1151 (ROCm/legacy-rocm-build #6034). ENV, not only
# profile.d, so that `toolbox run` (podman/docker run) has it too.
ENV ROCM_PATH=/opt/rocm \
    HIP_PATH=/opt/rocm \
    PATH=/opt/venv/bin:/opt/rocm/bin:$PATH \
    TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1

# rccl 79e85e1468f96a867108043c953e9547c13b4c5e: the one librccl on the library path (torch's copies link to it)
COPY --from=rccl-build /opt/rccl /opt/rccl
ENV LD_LIBRARY_PATH=/opt/rccl/lib

# torch 2.11.0+rocm7.13.0 from https://repo.amd.com/rocm/whl/gfx1151/
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install \
      --torch-index https://repo.amd.com/rocm/whl/gfx1151/ \
      torch==2.11.0+rocm7.13.0 \
      torchvision==0.26.0+rocm7.13.0 \
      torchaudio==2.11.0+rocm7.13.0
# Every other librccl (ROCm's, the copy torch's wheel or its rocm-sdk packages bundle) becomes
# a link to ours, so whichever name and search path torch resolves lands on the patched build.
RUN ours=$(readlink -f /opt/rccl/lib/librccl.so.1) \
 && find /opt/rocm/ /opt/venv/lib -name 'librccl.so*' \( -type f -o -type l \) ! -path '/opt/rccl/*' \
      -print -exec ln -sfn "$ours" {} \;
# The RCCL we built must export every nccl*/rccl* symbol torch imports (else `import torch` breaks).
RUN /opt/venv/bin/python /opt/toolbox/scripts/rccl-abi-check.py \
      --provider /opt/rccl/lib/librccl.so.1 \
      --consumer "$(/opt/venv/bin/python -c 'import importlib.util, os; print(os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "lib", "libtorch_hip.so"))')"
# ...and `import torch` (no GPU needed) must map exactly that library.
RUN /opt/venv/bin/python -c 'import torch; maps = {l.split()[-1] for l in open("/proc/self/maps") if "librccl" in l}; print("librccl mapped:", *maps); assert maps and all(m.startswith("/opt/rccl/") for m in maps), maps'
# One HIP runtime: `import torch` (its SDK's HIP, COMGR and RCCL, preloaded by path) and librccl
# loaded by name, as a collective does, must map exactly one libamdhip64, its HSA runtime and
# COMGR beside it; the build log says which (toolbox/rccl/hipcheck.py: the reports it prevents).
RUN /opt/venv/bin/python /opt/toolbox/scripts/hip-runtime-check.py --load librccl.so.1

# bitsandbytes 0.50.1 @ 37d2a9387f7146ccb85517ff45c665d345bfda79, built above for this image's HIP
COPY --from=bitsandbytes-build /wheels/bitsandbytes/ /opt/toolbox/wheels/bitsandbytes/
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install /opt/toolbox/wheels/bitsandbytes/bitsandbytes-0.50.1-*.whl \
      torch==2.11.0+rocm7.13.0 \
      torchvision==0.26.0+rocm7.13.0 \
      torchaudio==2.11.0+rocm7.13.0
# HIP 7.13 (the stack's): bitsandbytes must pick
# the library for exactly that HIP by its own rule (a missing exact build falls back to another
# HIP's with only a warning), ship it and load it against this image's ROCm (RUNPATH
# /opt/rocm/lib); a 4-bit matmul runs where a GPU is visible, else its 4-bit entry points are
# looked up (scripts/bnb-check.py). The build log names the library.
RUN env -u BNB_ROCM_VERSION /opt/venv/bin/python /opt/toolbox/scripts/bnb-check.py --hip 7.13

# Hugging Face stack and every other package of the stack's Python lock, each file's sha256 checked
COPY python-lock/all.txt /opt/toolbox/python-lock/all.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt

# unsloth 2026.10.9 from PyPI
# On ROCm these requirements of PyPI Unsloth are not taken from PyPI:
#   bitsandbytes: the stack builds it from git for its GPU targets
#   triton: the ROCm torch's own, from its index
#   xformers: PyPI's are CUDA builds; Unsloth uses torch's SDPA without it
# unsloth and unsloth_zoo came with the Python lock above (hash-checked, --no-deps), which holds
# none of these; the triton installed must still be the ROCm torch's
RUN /opt/venv/bin/python -c 'from importlib.metadata import version; v = version("triton"); print("triton", v); assert "+rocm" in v, "triton " + v + ": not the ROCm build"'

# llama.cpp @ 0c1e57098bba43ac29e6e3b677cdceebdd22334f (hip): programs on PATH (with the OpenMP runtime they link),
# the converter with its own gguf-py (and sentencepiece, which it imports for every Llama model)
COPY --from=llama_cpp-build /opt/llama.cpp/ /opt/llama.cpp/
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/os-install.sh fedora libgomp
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

# the training entrypoints (finetune, launch, rccl-check); then every installed requirement must hold
# but xformers, which nothing provides on ROCm (see the Unsloth step);
# then the venv's commands into /usr/local/bin, where toolbx/distrobox shells (host PATH) look
COPY entrypoints/ /opt/toolbox/entrypoints/
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --no-deps /opt/toolbox/entrypoints \
 && /opt/toolbox/scripts/pip.sh check --missing-ok xformers \
 && /opt/toolbox/scripts/link-venv.sh
COPY stack.lock.yaml /opt/toolbox/stack.lock.yaml

LABEL \
    com.github.containers.toolbox="true" \
    io.github.toolbox.accelerate.version="1.15.0" \
    io.github.toolbox.base.image="registry.fedoraproject.org/fedora:43" \
    io.github.toolbox.bitsandbytes.commit="37d2a9387f7146ccb85517ff45c665d345bfda79" \
    io.github.toolbox.bitsandbytes.version="0.50.1" \
    io.github.toolbox.datasets.version="4.8.4" \
    io.github.toolbox.gpu_targets="gfx1151" \
    io.github.toolbox.llama_cpp.backend="hip" \
    io.github.toolbox.llama_cpp.commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f" \
    io.github.toolbox.llama_cpp.gpu_targets="gfx1151" \
    io.github.toolbox.llama_cpp.sentencepiece="0.2.3" \
    io.github.toolbox.llama_cpp.source="git" \
    io.github.toolbox.lock-digest="7ebaa487873c" \
    io.github.toolbox.peft.version="0.21.2" \
    io.github.toolbox.platform="rocm" \
    io.github.toolbox.python.lock.sha256="0393a8e7e5a3d993b31d073837b432bbe17681eb483ee13a23ee504d334a084b" \
    io.github.toolbox.ray.version="2.60.0" \
    io.github.toolbox.rccl.build_rccl_tests="true" \
    io.github.toolbox.rccl.commit="79e85e1468f96a867108043c953e9547c13b4c5e" \
    io.github.toolbox.rccl.enable_smi="false" \
    io.github.toolbox.rccl.fault_injection="false" \
    io.github.toolbox.rccl.gpu_targets="gfx1151" \
    io.github.toolbox.rccl.patches.sha256="760b7bb89c14788998eb32068edb5c2d4924f0e850e70eb6d5ed56bb4d53833a" \
    io.github.toolbox.rccl.repo="https://github.com/ROCm/rocm-systems" \
    io.github.toolbox.rocm.source="tarball" \
    io.github.toolbox.rocm.tarball.sha256="unverified" \
    io.github.toolbox.rocm.tarball.url="https://repo.amd.com/rocm/tarball/therock-dist-linux-gfx1151-7.13.0.tar.gz" \
    io.github.toolbox.rocm.version="7.13.0" \
    io.github.toolbox.stack="gfx1151" \
    io.github.toolbox.torch.index_url="https://repo.amd.com/rocm/whl/gfx1151/" \
    io.github.toolbox.torch.version="2.11.0+rocm7.13.0" \
    io.github.toolbox.torchaudio.version="2.11.0+rocm7.13.0" \
    io.github.toolbox.torchvision.version="0.26.0+rocm7.13.0" \
    io.github.toolbox.transformers.version="5.17.0" \
    io.github.toolbox.trl.version="1.15.0" \
    io.github.toolbox.unsloth.version="2026.10.9" \
    io.github.toolbox.unsloth_zoo.version="2026.10.9" \
    org.opencontainers.image.base.name="registry.fedoraproject.org/fedora:43" \
    org.opencontainers.image.description="LLM fine-tuning toolbox for AMD Strix Halo (gfx1151)" \
    org.opencontainers.image.licenses="Apache-2.0" \
    org.opencontainers.image.source="https://github.com/toolbox/toolbox" \
    org.opencontainers.image.title="toolbox-gfx1151" \
    org.opencontainers.image.vendor="toolbox" \
    org.opencontainers.image.version="7ebaa487873c"
