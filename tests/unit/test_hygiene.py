"""The hygiene fixture itself must be able to fail."""

import asyncio

import pytest

pytest_plugins = ["pytester"]


def test_leak_check_fails_a_leaking_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        (__import__("pathlib").Path(__file__).parents[1] / "conftest.py").read_text()
    )
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(
        """
        import asyncio

        async def test_leaks():
            asyncio.get_running_loop().create_task(asyncio.sleep(10), name="orphan")
        """
    )
    result = pytester.runpytest("-p", "asyncio")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*left 1 task(s) running: orphan*"])


async def test_owned_tasks_pass() -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(asyncio.sleep(0), name="owned")
