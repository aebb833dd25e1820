"""kernelmap: framework op -> library call -> kernel, side by side across frameworks."""

__version__ = "0.1.0"
