"""GRPO's built-in `python_tests` reward: each completion's code (its last ```python block, else the
whole text) run with its row's `tests` in the sandbox, a bounded pool of completions at once; the
reward is the fraction of the row's tests that passed (a row's `tests` is a list of snippets, e.g.
`assert add(1, 2) == 3`, or one string: one test, so 1 or 0)."""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from toolbox_train.sandbox.jail import Result, run
from toolbox_train.sandbox.limits import Limits

FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(completion) -> str:
    """The code of a completion (a string, or a conversation: its last message's content)."""
    text = completion[-1]["content"] if isinstance(completion, list) and completion else str(completion)
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else text


def _tests(value, row: int) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) for t in value):
        return list(value)
    raise ValueError(f"python_tests: row {row + 1}'s `tests` is {type(value).__name__} {str(value)[:60]!r}: "
                     "expected a non-empty list of Python snippets (or one string)")


def python_tests(limits: Limits | None = None, on_result: Callable[[Result], None] | None = None) -> Callable:
    """TRL's reward function over a `tests` column; `on_result` sees each run's Result."""
    limits = limits or Limits()
    warned: set[str] = set()

    def python_tests(completions, tests=None, **_):  # TRL names the metric after it: rewards/python_tests/mean
        if tests is None:
            raise ValueError("python_tests needs a `tests` column in the data (a list of Python snippets per row)")
        jobs = [(extract_code(c), _tests(t, i)) for i, (c, t) in enumerate(zip(completions, tests))]
        with ThreadPoolExecutor(max_workers=min(limits.workers, len(jobs) or 1),
                                thread_name_prefix="sandbox") as pool:
            results = list(pool.map(lambda job: run(job[0], job[1], limits), jobs))
        for res in results:
            if on_result:
                on_result(res)
            if res.status == "sandbox_error" and res.detail not in warned:  # scored 0; said once per cause
                warned.add(res.detail)
                print(f"python_tests: the sandbox failed ({res.detail}): that completion scores 0", file=sys.stderr)
        return [res.score for res in results]

    return python_tests
