"""The first hour: what a newcomer meets before any measurement (nox -l, nox -s compare, the
install's warnings, the JAX environment on a GPU machine, the README's own commands)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _noxfile():
    pytest.importorskip("nox")
    from conftest import noxfile_module

    return noxfile_module()


class _Session:
    """What a nox session asks of nox, recorded (no command runs)."""

    def __init__(self, posargs=()):
        self.posargs, self.env, self.calls, self.installs = list(posargs), {}, [], []

    def run(self, *args, **kwargs):
        self.calls.append([str(a) for a in args])
        return True  # nox's session.run: True for a command that ran (None only where --install-only skipped it)

    def install(self, *args, **kwargs):
        self.installs.append(args)

    def log(self, msg):
        pass

    def error(self, msg):
        raise RuntimeError(msg)


def test_nox_list_shows_whole_sentences():
    """`nox -l` shows each session's docstring's first line: it was cut mid-parenthesis."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = [f for f in tree.body if isinstance(f, ast.FunctionDef)
                and any("session" in ast.unparse(d) for d in f.decorator_list)]
    assert len(sessions) >= 8
    for f in sessions:
        first = (ast.get_docstring(f) or "").splitlines()[0]
        assert first.endswith(".") and first.count("(") == first.count(")") and len(first) <= 88, (f.name, first)


def test_compare_uses_the_frameworks_environment(tmp_path, monkeypatch):
    """`nox -s compare` built its own 443 MB environment for one command .nox/frameworks has."""
    nf = _noxfile()
    monkeypatch.setattr(nf, "FRAMEWORKS_ENV", tmp_path / "frameworks")
    session = _Session()
    with pytest.raises(RuntimeError, match="run `nox -s bench` first"):
        nf.compare(session)
    (tmp_path / "frameworks" / "bin").mkdir(parents=True)
    (tmp_path / "frameworks" / "bin" / "kernelmap").write_text("")
    nf.compare(session)
    assert session.installs == []
    assert session.calls == [[str(tmp_path / "frameworks" / "bin" / "kernelmap"), "compare", "--fail", "mean:5%"]]


@pytest.mark.parametrize("cc, wanted", [((9, 0), "own-env-gpu.txt"), (None, "own-env.txt")])
def test_jax_workers_get_the_gpu_build_on_a_gpu_machine(tmp_path, monkeypatch, cc, wanted):
    """own-env.txt holds jax[cpu]: on a GPU machine JAX's workers would have run on the CPU."""
    nf = _noxfile()
    monkeypatch.chdir(tmp_path)
    for name in ("JAX",):
        monkeypatch.delenv(f"KERNELMAP_PYTHON_{name}", raising=False)
    monkeypatch.setattr(nf, "_gpu_compute_capability", lambda: cc)
    session = _Session()
    nf._own_env_pythons(session)
    (pip,) = [c for c in session.calls if "-r" in c]
    assert Path(pip[pip.index("-r") + 1]).name == wanted
    assert "jax[cuda13]" in (nf.FRAMEWORKS_DIR / "jax" / "own-env-gpu.txt").read_text()


def test_every_package_folder_is_listed():
    """A folder of package data that is not a listed package made setuptools print ~45 lines
    ("Package 'kernelmap.frameworks.mxnet.patches' is absent from the packages configuration") in
    every nox session."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = {"kernelmap": ROOT / "kernelmap", **{f"kernelmap.{k.split('.')[-1]}": ROOT / v
                                                for k, v in conf["package-dir"].items()}}
    found = set()
    for pkg, root in dirs.items():
        for d in [root, *root.rglob("*")]:
            if d.is_dir() and d.name != "__pycache__" and any(f.is_file() for f in d.iterdir()):
                found.add(".".join([pkg, *d.relative_to(root).parts]))
    assert found == listed, (found - listed, listed - found)
    assert set(conf["package-data"]) <= listed


def test_architecture_fits_one_screen():
    assert len((ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()) <= 60


def test_readme_quick_start_installs_what_the_tests_need():
    """The browser tests skip without Chromium (.ci/run installs it), the native helpers' tests without a C
    compiler and Python headers (setup.py builds them where it can); `apt-get install` without `-y` and
    without `apt-get update` stops without a terminal."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 12_000
    browser = (ROOT / "tests" / "test_report_browser.py").read_text()
    assert '"chromium"' in browser
    lines = [line for line in readme.splitlines() if line.startswith("apt-get")]
    assert len(lines) == 2  # CPU and GPU quick starts
    for line in lines:
        assert line.startswith("apt-get update && apt-get install -y ")
        assert {"dataset-fashion-mnist", "python3-venv", "chromium", "gcc", "python3-dev"} <= set(line.split("#")[0].split())


def test_mxnet_build_resumes_from_beside_the_cache(tmp_path, monkeypatch):
    """The GPU user's path: an interrupted `kernelmap build-mxnet` resumes from its work directory,
    which lives beside the cache (not in $TMPDIR, which a reboot empties) and is never taken for a tree."""
    from kernelmap.frameworks.mxnet import build, built

    monkeypatch.setenv(built.ENV_HOME, str(tmp_path))
    work = build.default_work(built.mxnet_home(), built.tree_name(build.MXNET_VERSION, 90))
    assert work.parent == tmp_path and work.name.startswith(".")
    (work / "build").mkdir(parents=True)
    assert built.find_trees(tmp_path) == []
