"""The setuptools route: ``python setup_ext.py build_ext --build-lib DIR`` builds kernelmap_custom's
pybind11 module with ``CUDAExtension`` (``CppExtension`` where KERNELMAP_WITH_CUDA=0). Run by
frameworks/pytorch/custom_op/build.py in this folder; the module's name comes from
KERNELMAP_EXT_NAME (keyed by the source hash, so builds of other sources never clash)."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

name = os.environ["KERNELMAP_EXT_NAME"]
with_cuda = os.environ.get("KERNELMAP_WITH_CUDA") == "1"
if with_cuda:
    ext = CUDAExtension(name, ["kernelmap_custom.cpp", "kernelmap_custom_cuda.cu"], define_macros=[("WITH_CUDA", None)])
else:
    ext = CppExtension(name, ["kernelmap_custom.cpp"])
setup(name=name, ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)})
