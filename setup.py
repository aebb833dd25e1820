"""The optional native helpers (kernelmap/_native.c, loaded by kernelmap/native.py: the Kineto scanner,
op nesting, SQLite columns, object codes) and the CPU sampler's thread (kernelmap/_cpuclock.c). Everything else is in pyproject.toml. Where no C compiler is found the build goes on
without them and the adapters take their Python paths (the same records, slower)."""

import sys

from setuptools import Extension, setup

LINUX = sys.platform.startswith("linux")
setup(ext_modules=[Extension("kernelmap._native", ["kernelmap/_native.c"], optional=True,
                             extra_compile_args=["-O3"],
                             libraries=["dl", "pthread"] if LINUX else []),
                   # the CPU sampler's thread (kernelmap/cpusampler.py): Linux's per-thread CPU clocks
                   *([Extension("kernelmap._cpuclock", ["kernelmap/_cpuclock.c"], optional=True,
                                extra_compile_args=["-O2"], libraries=["pthread"])] if LINUX else [])])
