"""Runs inside the sandbox (its source is passed to `python -I -c`; standard library only): reads
the job (limits, code, tests) from stdin, sets the rlimits on itself before any of the code runs,
runs the code, then each test in the code's namespace, and writes one line per step to the result
pipe (fd in argv[1]): `start`, `code ok` or `code error TYPE`, `test I 1|0`, `done`. Only the
process that started writes: a child the code forks and that returns here exits at once."""

import json
import os
import resource
import sys


def main():
    me, fd = os.getpid(), int(sys.argv[1])
    job = json.loads(sys.stdin.buffer.read())
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)  # the code reads an empty stdin
    os.close(devnull)
    lim = job["limits"]
    mib = 1 << 20
    for name, soft, hard in (("RLIMIT_CORE", 0, 0),
                             ("RLIMIT_CPU", lim["cpu_seconds"], lim["cpu_seconds"] + 1),  # SIGXCPU, then SIGKILL
                             ("RLIMIT_AS", lim["memory_mb"] * mib, lim["memory_mb"] * mib),
                             ("RLIMIT_FSIZE", lim["file_mb"] * mib, lim["file_mb"] * mib),
                             ("RLIMIT_NOFILE", 256, 256),
                             # counted per user namespace (Linux >= 5.14): this sandbox's processes only
                             ("RLIMIT_NPROC", lim["processes"], lim["processes"])):
        resource.setrlimit(getattr(resource, name), (soft, hard))

    def say(line):
        if os.getpid() != me:  # a forked child of the code came back here: it reports nothing
            os._exit(0)
        os.write(fd, (line + "\n").encode())

    say("start")
    scope = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "solution.py", "exec"), scope)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the code's, not ours
        say(f"code error {type(exc).__name__}")
        return
    say("code ok")
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"test_{i}.py", "exec"), scope)
            ok = 1
        except BaseException:
            ok = 0
        say(f"test {i} {ok}")
    say("done")


main()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    pass
os._exit(0)  # no atexit handlers of the code
