"""The llama.cpp component: pins, labels, stack checks, the rendered stages, and doctor."""

from __future__ import annotations

import pytest

from toolbox.errors import UserError
from toolbox.stack.load import load_stack
from toolbox_train.commands import health as doctor

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def test_rocm_stack_builds_hip_for_its_targets():
    from toolbox.components.llama_cpp import cmake_flags

    s = load_stack("gfx1151")
    assert s.model.llama_cpp.commit == COMMIT and s.model.llama_cpp.backend == "hip"
    flags = cmake_flags(s)
    assert "-DGGML_HIP=ON" in flags and '-DGPU_TARGETS="gfx1151"' in flags
    from toolbox.rendering import render_dockerfile as render

    df = render(s)
    assert "FROM devel AS llama_cpp-build" in df
    assert f"git-fetch.sh https://github.com/ggml-org/llama.cpp {COMMIT} /src/llama.cpp" in df
    assert "COPY --from=llama_cpp-build /opt/llama.cpp/ /opt/llama.cpp/" in df
    assert f'io.github.toolbox.llama_cpp.commit="{COMMIT}"' in df
    assert 'io.github.toolbox.llama_cpp.gpu_targets="gfx1151"' in df
    # builder results only: no llama.cpp sources or build tree in the runtime stage
    runtime = df.split("FROM base AS runtime", 1)[1]
    assert "/src/llama.cpp" not in runtime and "cmake" not in runtime


def test_backend_cpu_drops_hip():
    from toolbox.rendering import render_dockerfile as render

    s = load_stack("gfx1151", ["llama_cpp.backend=cpu"])
    df = render(s)
    assert "-DGGML_HIP=ON" not in df and 'io.github.toolbox.llama_cpp.backend="cpu"' in df


@pytest.mark.parametrize("override, field", [
    ("llama_cpp.commit=master", "llama_cpp.commit"),
    ("llama_cpp.backend=cuda", "llama_cpp.backend"),
    ("llama_cpp.source=pypi", "llama_cpp.version"),
])
def test_bad_llama_cpp_pins_are_refused(override, field):
    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        load_stack("gfx1151", [override])


def test_pypi_sdist_source_renders_a_hash_checked_download():
    from toolbox.rendering import render_dockerfile as render

    sha = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    s = load_stack("cuda", ["llama_cpp.source=pypi", "llama_cpp.version=0.3.36", f"llama_cpp.sdist_sha256={sha}"])
    df = render(s)
    assert "pip.sh download --no-deps --no-binary=llama-cpp-python -d /tmp/lcpp llama-cpp-python==0.3.36" in df
    assert f"printf '%s  %s\\n' {sha} /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz" in df and "sha256sum -c" in df


def test_doctor_checks_the_locked_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_DIR", str(tmp_path))
    lock = {"llama_cpp.commit": COMMIT, "llama_cpp.version": "0.3.36", "llama_cpp.backend": "cpu"}
    [c] = doctor.check_llama_cpp(lock)
    assert c.status == "fail" and "no VERSION" in c.detail
    (tmp_path / "VERSION").write_text("llama.cpp 0000000000000000000000000000000000000000 (cpu)\n")
    [c] = doctor.check_llama_cpp(lock)
    assert c.status == "fail" and f"lock pins {COMMIT}" in c.detail
    (tmp_path / "VERSION").write_text(f"llama.cpp {COMMIT} (cpu)\n")
    [c] = doctor.check_llama_cpp(lock)
    assert c.status == "fail" and "llama-quantize" in c.detail
    assert doctor.check_llama_cpp({})[0].status == "info"
    # llama_cpp.version is the sdist's, not an installed pip package: no pin check for it
    assert not [c for c in doctor.check_pins(lock)]
