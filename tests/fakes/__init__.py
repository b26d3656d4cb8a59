"""Fakes at leoflow's seams, for narrow unit tests of the lifecycle (``tests/unit/test_lifecycle*.py``)."""
