import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # pyproject's addopts carry --benchmark-skip so that `python -m pytest` stays fast;
    # pytest-benchmark lets --benchmark-only, not --benchmark-enable, override it. The
    # documented command is `python -m pytest tests/benchmarks --benchmark-enable`.
    session = getattr(config, "_benchmarksession", None)
    if session is not None and config.getoption("benchmark_enable", False):
        session.skip = False
