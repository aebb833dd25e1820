"""The GPU operator sources of MXNet 1.9.1: every ``src/operator/**/*.cu`` of the probe kit's source tarball
(shared/mxnet-sm90/src/mxnet-1.9.1-slim.tar.gz), byte for byte, for tests/test_mxnet_fp16_gpu_ops.py (which
reads from them which operator each .cu gives a GPU implementation); and the sources outside src/operator that
every build compiles and that hold the GPU code of the engine functions the steps run besides operators (the
copies between contexts, the KVStore's sum, a scalar fill: ``ALWAYS``), with the KVStore's own two headers.

    python tests/data/mxnet_operator_cu/make_fixture.py KIT_SRC_DIR

Writes operator-cu.tar.xz (members ``mxnet/src/operator/...``) and always-cu.tar.xz (``ALWAYS``) beside this
script, sorted, times and owners zeroed. The kit's tarball is read, never unpacked to disk.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP_PREFIX, KEEP_SUFFIX = "mxnet/src/operator/", ".cu"
ALWAYS = tuple(f"mxnet/src/{p}" for p in ("ndarray/ndarray.cc", "ndarray/ndarray_function.cu",
                                          "ndarray/ndarray_function-inl.h", "kvstore/comm.h", "kvstore/kvstore_local.h"))


def write(src: Path, out: Path, keep) -> int:
    """Copy the members of tarball ``src`` that ``keep`` accepts into ``out`` (xz), sorted; how many."""
    n = 0
    with tarfile.open(src) as tin, tarfile.open(out, "w:xz", preset=9) as tout:
        for m in sorted((m for m in tin if m.isfile() and keep(m.name)), key=lambda m: m.name):
            info = tarfile.TarInfo(m.name)
            info.size, info.mode = m.size, 0o644
            tout.addfile(info, tin.extractfile(m))
            n += 1
    return n


def main(kit: Path) -> int:
    src = kit / "mxnet-1.9.1-slim.tar.gz"
    n = write(src, HERE / "operator-cu.tar.xz", lambda name: name.startswith(KEEP_PREFIX) and name.endswith(KEEP_SUFFIX))
    k = write(src, HERE / "always-cu.tar.xz", lambda name: name in ALWAYS)
    print(f"{HERE}: {n} operator .cu files and {k} of {len(ALWAYS)} other sources of {src}")
    return 0 if n and k == len(ALWAYS) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
