# Rendered by `toolbox render` from stack "gfx1151-rocm10.0" (lock 113855782be7).
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
      python3.13 \
      shadow-utils \
      sudo \
      tar \
      time \
      util-linux \
      wget \
      which \
      xz
RUN python3.13 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY scripts/profile.sh /etc/profile.d/toolbox-image.sh

# ---- rocm: TheRock 10.0.0 dist tarball for gfx1151: sha256 and layout checked ----
FROM base AS rocm-fetch
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/fetch-archive.sh \
      --url https://stable.repo.amd.com/rocm/core/tarball/therock-dist-linux-gfx1151-10.0.0.tar.gz \
      --sha256 4feabd9f2da72352df37f6d714a54847d3fe913c0341fbe2a6542c1164024baf \
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

# ---- rccl: https://github.com/ROCm/rocm-systems @ 6b0e43f341195e203754e08f850e437ff2fc09f9 (projects/rccl), patch series none, for gfx1151 ----
FROM devel AS rccl-build
RUN --mount=type=secret,id=ca \
    /opt/toolbox/scripts/git-fetch.sh https://github.com/ROCm/rocm-systems 6b0e43f341195e203754e08f850e437ff2fc09f9 /src/rocm-systems
# RCCL comes from the sources of the ROCm torch was built against: the tarball's TheRock manifest
# must name this rocm-systems commit (checked here too, as a pinned sha256 skips the first-use check).
RUN /opt/venv/bin/python -c 'import json; subs = json.load(open("/opt/rocm/share/therock/therock_manifest.json")).get("submodules") or []; \
got = {s.get("commit") for s in subs if "rocm-systems" in (str(s.get("path", "")).rstrip("/").rsplit("/", 1)[-1], str(s.get("url", "")).rstrip("/").removesuffix(".git").rsplit("/", 1)[-1])}; \
assert got <= {"6b0e43f341195e203754e08f850e437ff2fc09f9"}, f"the ROCm tarball was built from rocm-systems {got}, rccl.commit is 6b0e43f341195e203754e08f850e437ff2fc09f9"; print("rocm-systems:", got or "not named")'
RUN --mount=type=cache,target=/root/.ccache \
    cmake -S /src/rocm-systems/projects/rccl -B /build/rccl -GNinja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/opt/rccl \
      -DCMAKE_CXX_COMPILER=/opt/rocm/bin/amdclang++ \
      -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DROCM_PATH=/opt/rocm \
      -DEXPLICIT_ROCM_VERSION=10.0.0 \
      -DGPU_TARGETS="gfx1151" \
      -DBUILD_TESTS=OFF \
      -DGENERATE_SYM_KERNELS=OFF \
      -DENABLE_AMDSMI=ON \
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

# rocm 10.0.0
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

# rccl 6b0e43f341195e203754e08f850e437ff2fc09f9: the one librccl on the library path (torch's copies link to it)
COPY --from=rccl-build /opt/rccl /opt/rccl
ENV LD_LIBRARY_PATH=/opt/rccl/lib

# torch 2.13.0+rocm10.0.0 from https://stable.repo.amd.com/rocm/whl-next/
# The whole ROCm set by URL and sha256, from no index (--no-index --no-deps; setuptools first: it
# builds the `rocm` sdist). Then requires.py proves the set closed: every requirement one of its
# wheels has on a ROCm name is met by another, so the last pip call, which adds torch's own PyPI
# dependencies (sympy, networkx, ...), finds the whole set installed and asks PyPI for none of it.
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --no-index --no-deps 'setuptools @ https://files.pythonhosted.org/packages/ef/55/6dc6d6bb953bdfc52519a0059592c52b6e3b8ad51cf8256dffceb55b0610/setuptools-84.2.1-py3-none-any.whl#sha256=ca140b45d5325a9478f880e351484f62fef15f336462e449ca0c03c873d589c2' \
 && ROCM_SDK_TARGET_FAMILY=gfx1151 ROCM_BOOTSTRAP_DISABLE_DETECTION=1 /opt/toolbox/scripts/pip.sh install \
      --no-index \
      --no-deps \
      --no-build-isolation \
      'torch[device-gfx1151] @ https://stable.repo.amd.com/rocm/whl-next/torch/torch-2.13.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=28cbb1dda100903127a02b7cca39742972b57c383f79e60b103617a2d0b7a064' \
      'torchvision[device-gfx1151] @ https://stable.repo.amd.com/rocm/whl-next/torchvision/torchvision-0.28.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=2cacf4672d025c1c24871cb4f7bdd40cc0ed073cb0458b89d665e47c2cc251be' \
      'torchaudio @ https://stable.repo.amd.com/rocm/whl-next/torchaudio/torchaudio-2.11.0.2%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=7b5a98831486138582b67127e50ecb21576acbf9d85d343205847c966d1ea3ab' \
      'amd-torch-device-gfx1151 @ https://stable.repo.amd.com/rocm/whl-next/amd-torch-device-gfx1151/amd_torch_device_gfx1151-2.13.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=33dfb69b1d6d89127aec416d2891b205ed31d7ffb0a106aa45a54da7afd0c01d' \
      'amd-torch-device-gfx115x @ https://stable.repo.amd.com/rocm/whl-next/amd-torch-device-gfx115x/amd_torch_device_gfx115x-2.13.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=44b27db9d540e589f2b17a78ca227a832f70c95ff7f476927507fbda92b524e5' \
      'amd-torchvision-device-gfx1151 @ https://stable.repo.amd.com/rocm/whl-next/amd-torchvision-device-gfx1151/amd_torchvision_device_gfx1151-0.28.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=847738fbb85db7e3cd6e711565a314bd145e71bb15f3b9271004b9821d18f234' \
      'rocm @ https://stable.repo.amd.com/rocm/whl-next/rocm/rocm-10.0.0.tar.gz#sha256=65b5982249612a310135f5e061b9f28909e8ad718a1ddb3f1abba92298b7216b' \
      'rocm-bootstrap @ https://stable.repo.amd.com/rocm/whl-next/rocm-bootstrap/rocm_bootstrap-0.1.0-py3-none-any.whl#sha256=33e3d4dad086b1f0e06bc049a618ca874d4fb72f758fff00676e23d2a644b652' \
      'rocm-sdk-core @ https://stable.repo.amd.com/rocm/whl-next/rocm-sdk-core/rocm_sdk_core-10.0.0-py3-none-linux_x86_64.whl#sha256=3bf4a72d11aa2a4ee1e90572c73630f937d38c1b7af4dda45b483b54655138a7' \
      'rocm-sdk-device-gfx1151 @ https://stable.repo.amd.com/rocm/whl-next/rocm-sdk-device-gfx1151/rocm_sdk_device_gfx1151-10.0.0-py3-none-linux_x86_64.whl#sha256=ec705df531e523777a5cd47b2dfadb2272935927c46c122effb11fcdcedb73d0' \
      'rocm-sdk-libraries @ https://stable.repo.amd.com/rocm/whl-next/rocm-sdk-libraries/rocm_sdk_libraries-10.0.0-py3-none-linux_x86_64.whl#sha256=bbe83a550cb8ceeb306abf6d57df6617857a1b19384549526db2ec81a4374e57' \
      'triton @ https://stable.repo.amd.com/rocm/whl-next/triton/triton-3.8.0%2Bgit4cff872c.rocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=874f41046c50f84392c8481f074a2f96cfc1dc44a9b05e162246cb7f9175e588' \
 && /opt/venv/bin/python /opt/toolbox/scripts/requires.py --closed 'torch[device-gfx1151]==2.13.0+rocm10.0.0' 'torchvision[device-gfx1151]==0.28.0+rocm10.0.0' torchaudio==2.11.0.2+rocm10.0.0 \
 && /opt/toolbox/scripts/pip.sh install \
      'torch[device-gfx1151]==2.13.0+rocm10.0.0' \
      'torchvision[device-gfx1151]==0.28.0+rocm10.0.0' \
      torchaudio==2.11.0.2+rocm10.0.0
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

# bitsandbytes 0.50.2: the PyPI manylinux wheel (its build for HIP 7.15), sha256 checked
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh download --no-deps --only-binary=:all: -d /tmp/bnb bitsandbytes==0.50.2 \
 && printf '%s  %s\n' 55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283 /tmp/bnb/bitsandbytes-0.50.2-*manylinux*x86_64.whl > /tmp/bnb.sha256 \
 && sha256sum -c /tmp/bnb.sha256 \
 && /opt/toolbox/scripts/pip.sh install /tmp/bnb/bitsandbytes-0.50.2-*.whl \
      'torch[device-gfx1151]==2.13.0+rocm10.0.0' \
      'torchvision[device-gfx1151]==0.28.0+rocm10.0.0' \
      torchaudio==2.11.0.2+rocm10.0.0 \
 && rm -rf /tmp/bnb /tmp/bnb.sha256
# HIP 7.15 (the stack's): bitsandbytes must pick
# the library for exactly that HIP by its own rule (a missing exact build falls back to another
# HIP's with only a warning), ship it and load it against this image's ROCm (RUNPATH
# /opt/rocm/lib); a 4-bit matmul runs where a GPU is visible, else its 4-bit entry points are
# looked up (scripts/bnb-check.py). The build log names the library.
RUN env -u BNB_ROCM_VERSION /opt/venv/bin/python /opt/toolbox/scripts/bnb-check.py --hip 7.15

# Hugging Face stack and every other package of the stack's Python lock, each file's sha256 checked
COPY python-lock/all.txt /opt/toolbox/python-lock/all.txt
RUN --mount=type=secret,id=ca \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    /opt/toolbox/scripts/pip.sh install --require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt

# unsloth 2026.10.9 from PyPI
# On ROCm these requirements of PyPI Unsloth are not taken from PyPI:
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
    io.github.toolbox.amd-torch-device-gfx1151.wheel_sha256="33dfb69b1d6d89127aec416d2891b205ed31d7ffb0a106aa45a54da7afd0c01d" \
    io.github.toolbox.amd-torch-device-gfx115x.wheel_sha256="44b27db9d540e589f2b17a78ca227a832f70c95ff7f476927507fbda92b524e5" \
    io.github.toolbox.amd-torchvision-device-gfx1151.wheel_sha256="847738fbb85db7e3cd6e711565a314bd145e71bb15f3b9271004b9821d18f234" \
    io.github.toolbox.base.image="registry.fedoraproject.org/fedora:43" \
    io.github.toolbox.bitsandbytes.source="pypi" \
    io.github.toolbox.bitsandbytes.version="0.50.2" \
    io.github.toolbox.bitsandbytes.wheel_sha256="55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283" \
    io.github.toolbox.datasets.version="4.8.4" \
    io.github.toolbox.gpu_targets="gfx1151" \
    io.github.toolbox.llama_cpp.backend="hip" \
    io.github.toolbox.llama_cpp.commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f" \
    io.github.toolbox.llama_cpp.gpu_targets="gfx1151" \
    io.github.toolbox.llama_cpp.sentencepiece="0.2.3" \
    io.github.toolbox.llama_cpp.source="git" \
    io.github.toolbox.lock-digest="113855782be7" \
    io.github.toolbox.peft.version="0.21.2" \
    io.github.toolbox.platform="rocm" \
    io.github.toolbox.python.lock.sha256="bc6857b45c3ebcb882e61a3e2ff833683bc6e1bba64eecef9c832e0f8ba30952" \
    io.github.toolbox.ray.version="2.60.0" \
    io.github.toolbox.rccl.build_rccl_tests="true" \
    io.github.toolbox.rccl.commit="6b0e43f341195e203754e08f850e437ff2fc09f9" \
    io.github.toolbox.rccl.enable_smi="true" \
    io.github.toolbox.rccl.fault_injection="false" \
    io.github.toolbox.rccl.gpu_targets="gfx1151" \
    io.github.toolbox.rccl.patches.sha256="none" \
    io.github.toolbox.rccl.repo="https://github.com/ROCm/rocm-systems" \
    io.github.toolbox.rocm-bootstrap.wheel_sha256="33e3d4dad086b1f0e06bc049a618ca874d4fb72f758fff00676e23d2a644b652" \
    io.github.toolbox.rocm-sdk-core.wheel_sha256="3bf4a72d11aa2a4ee1e90572c73630f937d38c1b7af4dda45b483b54655138a7" \
    io.github.toolbox.rocm-sdk-device-gfx1151.wheel_sha256="ec705df531e523777a5cd47b2dfadb2272935927c46c122effb11fcdcedb73d0" \
    io.github.toolbox.rocm-sdk-libraries.wheel_sha256="bbe83a550cb8ceeb306abf6d57df6617857a1b19384549526db2ec81a4374e57" \
    io.github.toolbox.rocm.hip_version="7.15" \
    io.github.toolbox.rocm.source="tarball" \
    io.github.toolbox.rocm.tarball.sha256="4feabd9f2da72352df37f6d714a54847d3fe913c0341fbe2a6542c1164024baf" \
    io.github.toolbox.rocm.tarball.url="https://stable.repo.amd.com/rocm/core/tarball/therock-dist-linux-gfx1151-10.0.0.tar.gz" \
    io.github.toolbox.rocm.version="10.0.0" \
    io.github.toolbox.rocm.wheel_sha256="65b5982249612a310135f5e061b9f28909e8ad718a1ddb3f1abba92298b7216b" \
    io.github.toolbox.setuptools.wheel_sha256="ca140b45d5325a9478f880e351484f62fef15f336462e449ca0c03c873d589c2" \
    io.github.toolbox.stack="gfx1151-rocm10.0" \
    io.github.toolbox.torch.device_extra="[device-gfx1151]" \
    io.github.toolbox.torch.index_url="https://stable.repo.amd.com/rocm/whl-next/" \
    io.github.toolbox.torch.version="2.13.0+rocm10.0.0" \
    io.github.toolbox.torch.wheel_sha256="28cbb1dda100903127a02b7cca39742972b57c383f79e60b103617a2d0b7a064" \
    io.github.toolbox.torchaudio.version="2.11.0.2+rocm10.0.0" \
    io.github.toolbox.torchaudio.wheel_sha256="7b5a98831486138582b67127e50ecb21576acbf9d85d343205847c966d1ea3ab" \
    io.github.toolbox.torchvision.version="0.28.0+rocm10.0.0" \
    io.github.toolbox.torchvision.wheel_sha256="2cacf4672d025c1c24871cb4f7bdd40cc0ed073cb0458b89d665e47c2cc251be" \
    io.github.toolbox.transformers.version="5.17.0" \
    io.github.toolbox.triton.wheel_sha256="874f41046c50f84392c8481f074a2f96cfc1dc44a9b05e162246cb7f9175e588" \
    io.github.toolbox.trl.version="1.15.0" \
    io.github.toolbox.unsloth.version="2026.10.9" \
    io.github.toolbox.unsloth_zoo.version="2026.10.9" \
    org.opencontainers.image.base.name="registry.fedoraproject.org/fedora:43" \
    org.opencontainers.image.description="LLM fine-tuning toolbox for AMD Strix Halo (gfx1151), ROCm 10.0.0" \
    org.opencontainers.image.licenses="Apache-2.0" \
    org.opencontainers.image.source="https://github.com/toolbox/toolbox" \
    org.opencontainers.image.title="toolbox-gfx1151-rocm10.0" \
    org.opencontainers.image.vendor="toolbox" \
    org.opencontainers.image.version="113855782be7"
