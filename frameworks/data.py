"""Training data, framework-free: which MNIST-format IDX files to use, checked and laid out once.

Real data is four IDX files (``train-images-idx3-ubyte`` etc., gzipped or not). The default is
Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (/usr/share/datasets/fashion-mnist).
``--data synthetic`` is an explicit choice, labelled as such everywhere; nothing falls back to it.

Each framework reads the files with its own loader (torchvision ``FashionMNIST``/``MNIST``,
``mxnet.gluon.data.vision.FashionMNIST``/``MNIST``). Those want different layouts:
torchvision ``ROOT/<ClassName>/raw/<uncompressed files>``, Gluon ``ROOT/<.gz files>``.
``prepare_dir`` builds both once under a cache directory (symlinks where the source already has
the right form, decompressed or compressed copies otherwise). Nothing here imports a framework.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernelmap.errors import KernelmapError

DEFAULT_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
KINDS = ("fashion-mnist", "mnist", "idx", "synthetic")
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FILES = SPLIT_FILES["train"] + SPLIT_FILES["test"]
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
# torchvision's dataset class per kind: its name is the folder torchvision looks in.
TORCHVISION_CLASS = {"fashion-mnist": "FashionMNIST", "mnist": "MNIST", "idx": "MNIST"}
SYNTHETIC_SIZES = (60_000, 10_000)
FIX = "install it with `apt-get install dataset-fashion-mnist`, point --data-dir at a directory of MNIST-format IDX files, or choose `--data synthetic` explicitly"


@dataclass(frozen=True)
class DataInfo:
    kind: str  # fashion-mnist | mnist | idx (an MNIST-format directory) | synthetic
    path: str | None  # the directory holding the IDX files; None for synthetic
    n_train: int
    n_test: int
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> digest (synthetic: of the arrays)
    files: dict[str, str] = field(default_factory=dict)  # IDX base name -> actual file in ``path``
    seed: int | None = None  # synthetic only

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def file_digest(path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _find(directory: Path, base: str) -> Path | None:
    for candidate in (directory / f"{base}.gz", directory / base):
        if candidate.is_file():
            return candidate
    return None


def read_idx_header(path: Path) -> tuple[int, ...]:
    """(magic, dims...) of an IDX file; raises KernelmapError naming the file when it is not one."""
    try:
        with _open(path) as fh:
            head = fh.read(16)
    except (OSError, EOFError) as exc:
        raise KernelmapError(f"{path}: cannot read ({exc})") from exc
    if len(head) < 8:
        raise KernelmapError(f"{path}: too short for an IDX file")
    magic = struct.unpack(">I", head[:4])[0]
    if magic == IMAGE_MAGIC and len(head) == 16:
        return struct.unpack(">IIII", head)
    if magic == LABEL_MAGIC:
        return struct.unpack(">II", head[:8])
    raise KernelmapError(f"{path}: not an MNIST-format IDX file (magic {magic})")


def _check_split(directory: Path, split: str) -> tuple[int, dict[str, Path]]:
    images_base, labels_base = SPLIT_FILES[split]
    images, labels = _find(directory, images_base), _find(directory, labels_base)
    for base, found in ((images_base, images), (labels_base, labels)):
        if found is None:
            raise KernelmapError(f"{directory}: no {base}(.gz) there; {FIX}")
    img = read_idx_header(images)
    lab = read_idx_header(labels)
    if img[0] != IMAGE_MAGIC or tuple(img[2:]) != (28, 28):
        raise KernelmapError(f"{images}: expected 28x28 images (IDX magic 2051), found header {img}")
    if lab[0] != LABEL_MAGIC:
        raise KernelmapError(f"{labels}: expected labels (IDX magic 2049), found header {lab}")
    if img[1] != lab[1]:
        raise KernelmapError(
            f"{directory}: {images.name} holds {img[1]} images but {labels.name} {lab[1]} labels"
        )
    return int(img[1]), {images_base: images, labels_base: labels}


def _idx_info(kind: str, directory: Path) -> DataInfo:
    if not directory.is_dir():
        raise KernelmapError(f"{directory}: no such data directory ({kind}); {FIX}")
    n_train, train_files = _check_split(directory, "train")
    n_test, test_files = _check_split(directory, "test")
    files = {**train_files, **test_files}
    return DataInfo(
        kind=kind,
        path=str(directory.resolve()),
        n_train=n_train,
        n_test=n_test,
        sha256={p.name: file_digest(p) for p in files.values()},
        files={base: p.name for base, p in files.items()},
    )


def synthetic_arrays(seed: int, split: str, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic synthetic images (N, 28, 28) uint8 and labels (N,) int64.

    Each class brightens its own horizontal band over uniform noise, so the model can learn it
    and test accuracy means something. Not a stand-in for real data: runs say ``synthetic``.
    """
    n = n if n is not None else SYNTHETIC_SIZES[0 if split == "train" else 1]
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, 7919])
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    images = rng.integers(0, 128, size=(n, 28, 28), dtype=np.uint8)
    rows = np.arange(28)[None, :]
    band = (rows >= 2 + 2 * labels[:, None]) & (rows < 6 + 2 * labels[:, None])  # (n, 28)
    images[band] += 120
    return images, labels


def synthetic_info(seed: int) -> DataInfo:
    digests = {}
    for split in ("train", "test"):
        images, labels = synthetic_arrays(seed, split)
        digests[f"{split}-images"] = hashlib.sha256(images.tobytes()).hexdigest()
        digests[f"{split}-labels"] = hashlib.sha256(labels.tobytes()).hexdigest()
    return DataInfo("synthetic", None, *SYNTHETIC_SIZES, sha256=digests, seed=seed)


def resolve_data(config) -> DataInfo:
    """Which data a run uses (``config.data``, ``config.data_dir``), checked; never a silent fallback.

    ``auto`` and ``fashion-mnist``: Fashion-MNIST in ``data_dir`` or /usr/share/datasets/fashion-mnist.
    ``mnist``: MNIST in ``data_dir`` (required). ``synthetic``: generated from ``config.seed``.
    Anything else is taken as a directory of MNIST-format IDX files (kind ``idx``).
    """
    data = config.data
    data_dir = getattr(config, "data_dir", None)
    if data == "synthetic":
        return synthetic_info(config.seed)
    if data in ("auto", "fashion-mnist"):
        return _idx_info("fashion-mnist", Path(data_dir or DEFAULT_DIRS["fashion-mnist"]))
    if data == "mnist":
        if not data_dir:
            raise KernelmapError(
                f"--data mnist needs --data-dir DIR holding the MNIST IDX files ({', '.join(FILES)})"
            )
        return _idx_info("mnist", Path(data_dir))
    return _idx_info("idx", Path(data).expanduser())


def default_cache_dir() -> Path:
    base = os.environ.get("KERNELMAP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernelmap"
    )
    return Path(base) / "data"


@dataclass(frozen=True)
class PreparedData:
    info: DataInfo
    gluon_root: Path  # ROOT with the four .gz files (gluon.data.vision.MNIST(root=...))
    torchvision_root: Path  # ROOT with <ClassName>/raw/<uncompressed files>
    torchvision_class: str


def _layout(info: DataInfo, dest: Path) -> None:
    src = Path(info.path)
    raw = dest / "torchvision" / TORCHVISION_CLASS[info.kind] / "raw"
    gz = dest / "gluon"
    raw.mkdir(parents=True)
    gz.mkdir(parents=True)
    for base, name in info.files.items():
        source = src / name
        if name.endswith(".gz"):
            os.symlink(source, gz / f"{base}.gz")
            with gzip.open(source, "rb") as fin, open(raw / base, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            os.symlink(source, raw / base)
            with open(source, "rb") as fin, gzip.open(gz / f"{base}.gz", "wb") as fout:
                shutil.copyfileobj(fin, fout)


def prepare_dir(info: DataInfo, cache_dir: str | os.PathLike | None = None) -> PreparedData:
    """Lay the IDX files out for torchvision and Gluon, once, keyed by their sha256 digests.

    Built under a temporary name and renamed into place, so concurrent workers either see a
    complete layout or build their own and discard it.
    """
    if info.synthetic:
        raise KernelmapError("synthetic data has no files to lay out")
    digest = hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(info.sha256.items())).encode()).hexdigest()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = root / f"{info.kind}-{digest[:16]}"
    if not (dest / "COMPLETE").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=root))
        try:
            _layout(info, tmp)
            (tmp / "COMPLETE").write_text(f"{info.path}\n{digest}\n")
            if dest.exists() and not (dest / "COMPLETE").is_file():
                shutil.rmtree(dest)  # left by an interrupted older version; never complete
            try:
                os.rename(tmp, dest)
            except OSError:
                if not (dest / "COMPLETE").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedData(info, dest / "gluon", dest / "torchvision", TORCHVISION_CLASS[info.kind])
