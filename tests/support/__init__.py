"""What the test modules share: launchers, readers, the exercise registry and its wrong answers (tests/README.md).

Test modules import from here, never from each other; fixtures live in tests/conftest.py.
"""
