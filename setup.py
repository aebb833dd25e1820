"""The optional native helpers of the adapters (kernelmap/adapters/_native.c: the Kineto scanner and
op nesting, SQLite columns). Everything else is in pyproject.toml. Where no C compiler is found the build goes on
without them and the adapters take their Python paths (the same records, slower)."""

import sys

from setuptools import Extension, setup

setup(ext_modules=[Extension("kernelmap.adapters._native", ["kernelmap/adapters/_native.c"], optional=True,
                             extra_compile_args=["-O3"],
                             libraries=["dl", "pthread"] if sys.platform.startswith("linux") else [])])
