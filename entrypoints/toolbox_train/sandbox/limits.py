"""The sandbox's limits as train.yaml writes them (`grpo.rewards.N.sandbox`), with safe defaults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(10.0, gt=0, le=600, description="wall-clock seconds per completion; then the whole "
                                                            "sandbox (its pid namespace) is killed")
    cpu_seconds: int = Field(5, ge=1, le=600, description="CPU seconds per process (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="address space per process in MiB (RLIMIT_AS)")
    processes: int = Field(8, ge=2, le=1024, description="processes and threads in the sandbox (RLIMIT_NPROC, "
                                                          "counted in its own user namespace), its init included")
    file_mb: int = Field(16, ge=1, description="largest file the code may write, MiB (RLIMIT_FSIZE)")
    disk_mb: int = Field(64, ge=1, description="size of the sandbox's writable tmpfs folder, MiB")
    output_kb: int = Field(64, ge=1, description="stdout+stderr kept; more kills the sandbox (output_limit)")
    workers: int = Field(4, ge=1, le=64, description="completions run at once")
    python: str | None = Field(None, description="the interpreter inside the sandbox (default: the trainer's own); "
                                                 "its folders are mounted read-only")

