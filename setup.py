"""The optional native helper of the Kineto reader (kernelmap/adapters/_kineto_scan.c). Everything
else is in pyproject.toml. Where no C compiler is found the build goes on without it and the
reader takes its Python path (the same records, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kernelmap.adapters._kineto_scan", ["kernelmap/adapters/_kineto_scan.c"],
                             optional=True, extra_compile_args=["-O3"])])
