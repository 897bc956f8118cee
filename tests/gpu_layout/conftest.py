from ..engine.conftest import _seeded  # noqa: F401  (the same fixed seed for every test)
