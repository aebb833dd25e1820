"""The GPU operator sources of MXNet 1.9.1: every ``src/operator/**/*.cu`` of the probe kit's source tarball
(shared/mxnet-sm90/src/mxnet-1.9.1-slim.tar.gz), byte for byte, for tests/test_mxnet_fp16_gpu_ops.py (which
reads from them which operator each .cu gives a GPU implementation).

    python tests/data/mxnet_operator_cu/make_fixture.py KIT_SRC_DIR

Writes operator-cu.tar.xz beside this script (members ``mxnet/src/operator/...``, sorted, times and owners
zeroed). The kit's tarball is read, never unpacked to disk.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP_PREFIX, KEEP_SUFFIX = "mxnet/src/operator/", ".cu"


def main(kit: Path) -> int:
    src = kit / "mxnet-1.9.1-slim.tar.gz"
    out = HERE / "operator-cu.tar.xz"
    n = 0
    with tarfile.open(src) as tin, tarfile.open(out, "w:xz", preset=9) as tout:
        members = sorted((m for m in tin if m.isfile() and m.name.startswith(KEEP_PREFIX)
                          and m.name.endswith(KEEP_SUFFIX)), key=lambda m: m.name)
        for m in members:
            data = tin.extractfile(m)
            info = tarfile.TarInfo(m.name)
            info.size, info.mode = m.size, 0o644
            tout.addfile(info, data)
            n += 1
    print(f"{out}: {n} .cu files of {src}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
