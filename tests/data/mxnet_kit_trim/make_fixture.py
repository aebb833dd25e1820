"""Trim the MXNet 1.9.1 source kit (shared/mxnet-sm90/src) to what tests/test_mxnet_build.py reads.

    python tests/data/mxnet_kit_trim/make_fixture.py KIT_SRC_DIR

Writes, beside this script, the kit's layout in two tarballs that ``build.prepare_source`` takes as a
directory of tarballs:
- mxnet-1.9.1-trim.tar.xz: every file the project's patches touch, the files ``build.check_source``
  requires and include/mxnet/base.h, byte for byte; every other .cc/.cu/.cuh/.h under src/, the
  .cc files of nnvm and dmlc-core's src/ (what ``build.count_sources`` counts) as empty files of the
  same names;
- openblas-trim.tar.xz: the kit's OpenBLAS tree (usr/...): the headers and the names of its libraries,
  emptied (``build.find_openblas`` and the cmake command look only at names).
The kit's own tarballs are read, never unpacked to disk.
"""

from __future__ import annotations

import io
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
from kernelmap.frameworks.mxnet import build  # noqa: E402

COUNTED = re.compile(r"^mxnet/(src/.*\.(cc|cu|cuh|h)|3rdparty/tvm/nnvm/src/.*\.cc|3rdparty/dmlc-core/src/.*\.cc)$")


def touched() -> set[str]:
    names = set()
    for patch in build.patch_files():
        for line in patch.read_text().splitlines():
            if line.startswith(("--- a/", "+++ b/")):
                names.add("mxnet/" + line[6:].split("\t")[0].strip())
    return names


def trim(kit: Path, tarballs: list[str], keep: set[str], out: Path, counted: re.Pattern, links: bool) -> int:
    """Files named in ``keep`` whole, those ``counted`` matches emptied, links where ``links``."""
    n = 0
    with tarfile.open(out, "w:xz") as dst:
        for name in tarballs:
            with tarfile.open(kit / name) as src:
                for m in src:
                    if m.isdir():
                        continue
                    whole = m.name in keep
                    if not whole and not counted.match(m.name) and m.isfile():
                        continue
                    if m.issym() or m.islnk():
                        if links:  # OpenBLAS' library links
                            dst.addfile(m)
                            n += 1
                        continue
                    data = src.extractfile(m).read() if whole else b""
                    info = tarfile.TarInfo(m.name)
                    info.size, info.mode, info.mtime = len(data), m.mode, 0
                    dst.addfile(info, io.BytesIO(data))
                    n += 1
    return n


def main(kit: Path) -> None:
    keep = touched() | {"mxnet/" + r for r in build.REQUIRED} | {"mxnet/include/mxnet/base.h"}
    mx = ["mxnet-1.9.1-slim.tar.gz", "dmlc.tar.gz", "dlpack.tar.gz", "tvm.tar.gz"]
    n = trim(kit, mx, keep, HERE / "mxnet-1.9.1-trim.tar.xz", COUNTED, False)
    with tarfile.open(kit / "openblas-deb12.tar.gz") as src:
        blas = {m.name for m in src if m.isfile() and m.name.endswith(".h")}
    b = trim(kit, ["openblas-deb12.tar.gz"], blas, HERE / "openblas-trim.tar.xz", re.compile(".*"), True)
    print(f"{n} MXNet files ({len(keep)} whole), {b} OpenBLAS files")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
