"""The optional native helpers (kernelmap/_native.c, loaded by kernelmap/native.py: the Kineto scanner,
op nesting, SQLite columns, object codes). Everything else is in pyproject.toml. Where no C compiler is found the build goes on
without them and the adapters take their Python paths (the same records, slower)."""

import sys

from setuptools import Extension, setup

setup(ext_modules=[Extension("kernelmap._native", ["kernelmap/_native.c"], optional=True,
                             extra_compile_args=["-O3"],
                             libraries=["dl", "pthread"] if sys.platform.startswith("linux") else [])])
