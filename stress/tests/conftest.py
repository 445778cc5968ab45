"""The harness's tests use the library suite's PostgreSQL server (tests/fix_pg.py;
the repository root is on sys.path: pyproject.toml's pytest ``pythonpath``)."""

pytest_plugins = ("tests.fix_pg",)
