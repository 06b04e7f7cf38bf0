"""What the tests share beyond ``builders``: fixture groups tests/conftest.py registers
(``pytest_plugins``) and helpers a folder's test files import (``from support.X import ...``;
pytest's ``pythonpath`` holds tests/). Each module says what it holds; none is a test module.
"""
