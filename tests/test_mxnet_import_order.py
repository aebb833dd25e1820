"""MXNet is imported after its libraries are loaded, whichever module of the package is imported first
(frameworks/mxnet/loaded.py): on the 2-GPU H200s parallel.py's own `import mxnet` ran ahead of the workload's
preload, libmxnet.so bound the system's cuDNN 9.14 instead of the 9.19 it was compiled against, and every MXNet
GPU worker crashed at its first operator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import importlib.abc, json, os, sys
order = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "mxnet":
            order.append("import mxnet")
        return None
sys.meta_path.insert(0, Watch())
from kernelmap.frameworks.mxnet import built
def fake_preload(tree):
    order.append("preload " + str(tree))
    return built.Preloaded(str(tree))
built.preload = fake_preload
os.environ[built.ENV_TREE] = "/a/tree"
import importlib
importlib.import_module("kernelmap.frameworks.mxnet." + sys.argv[1])
print(json.dumps(order))
"""


@pytest.mark.parametrize("first", ["parallel", "workload", "loaded"])
def test_mxnet_is_imported_after_the_preload_whichever_module_comes_first(first):
    pytest.importorskip("mxnet")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, first], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    order = json.loads(proc.stdout.strip().splitlines()[-1])
    assert order[:2] == ["preload /a/tree", "import mxnet"], order
