"""pytest's configuration for tests/python: the mark `long` (cases of tens of seconds), which the
default run (run_pytest.py, ctest python:pytest) leaves out and ctest python:pytest_long (label
long) runs alone."""


def pytest_configure(config):
    config.addinivalue_line("markers", "long: a case of tens of seconds; ctest python:pytest_long runs it")
