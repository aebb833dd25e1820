"""``kernelmap doctor``: what is installed and usable here, each missing piece with its fix.

Each framework is probed in its own subprocess (``python -c``), so the doctor imports no
framework itself and two frameworks' CUDA libraries never meet in one process. Its interpreter:
``--python NAME=PATH``, else ``$KERNELMAP_PYTHON_<NAME>``, else the environments nox made in the
checkout (``.nox/<name>-workers``, then ``.nox/frameworks``), else this one. The doctor is a report:
it exits 0 even when things are missing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import frameworks, gpuinfo
from .errors import KernelmapError

# where nox puts the environments (noxfile.py: FRAMEWORKS_ENV, own_env): relative to the checkout
NOX_SHARED_ENV = Path(".nox") / "frameworks"
NOX_OWN_ENV = ".nox/{name}-workers"

FIX = {
    **{name: d.install_fix for name, d in frameworks.REGISTRY.items()},
    "nsys": "install Nsight Systems (https://developer.nvidia.com/nsight-systems) and put `nsys` on PATH",
    "ncu": "install Nsight Compute (https://developer.nvidia.com/nsight-compute) and put `ncu` on PATH",
}


def checkouts() -> list[Path]:
    """The folders whose ``.nox/`` the doctor looks in: the current one, and the checkout this
    kernelmap was installed from (editable, as nox installs it), each once."""
    here = Path.cwd()
    source = Path(__file__).resolve().parent.parent
    return [here] + ([source] if source != here.resolve() and (source / "pyproject.toml").is_file() else [])


def interpreters(name: str, python: dict[str, str] | None = None, roots: list[Path] | None = None) -> list[str]:
    """The interpreters to probe framework ``name`` with, in order: the one named (``--python``,
    ``$KERNELMAP_PYTHON_<NAME>``) alone; else its own nox environment, this interpreter, then nox's
    shared one (those that exist, each once)."""
    named = frameworks.get(name).python(python)
    if named:
        return [named]
    roots = checkouts() if roots is None else roots
    found = [str(root / NOX_OWN_ENV.format(name=name) / "bin" / "python") for root in roots]
    found = [p for p in found if os.path.exists(p)]
    shared = [str(root / NOX_SHARED_ENV / "bin" / "python") for root in roots]
    found += [sys.executable] + [p for p in shared if os.path.exists(p)]
    return list(dict.fromkeys(found))


def probe_framework(name: str, timeout: float = 180.0, python: dict[str, str] | None = None,
                    look_in_nox: bool = False) -> dict[str, Any]:
    """Import framework ``name`` in a fresh interpreter: the one its workers would run under (named
    by ``python``/``$KERNELMAP_PYTHON_<NAME>``, else this one), or with ``look_in_nox`` the first of
    ``interpreters`` that has it; return its facts (its descriptor's probe) with ``python`` (the
    interpreter), or why it failed.

    The result always has ``installed`` (bool); when False, ``error`` (the last stderr line of the
    first interpreter tried) and ``fix``. A framework with its own environment on this GPU (an MXNet
    built for it) is probed there.
    """
    first = None
    tried = interpreters(name, python) if look_in_nox else [frameworks.get(name).python(python) or sys.executable]
    for exe in tried:
        facts = probe_with(name, exe, timeout)
        if facts["installed"]:
            return facts
        first = first or facts
    return first


def probe_with(name: str, exe: str, timeout: float = 180.0) -> dict[str, Any]:
    """``probe_framework`` with the one interpreter ``exe``."""
    extra = frameworks.get(name).own_env()
    try:
        out = subprocess.run(
            [exe, "-c", frameworks.get(name).probe],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, **extra} if extra else None,
        )
    except subprocess.TimeoutExpired:
        return {"installed": False, "error": f"importing {name} took more than {timeout:.0f} s", "fix": FIX[name]}
    except OSError as exc:  # a --python or $KERNELMAP_PYTHON_<NAME> that is not an interpreter
        return {"installed": False, "error": f"{exe}: cannot run it ({exc.strerror or exc})",
                "fix": f"point --python {name}=PATH or ${frameworks.get(name).python_env_var} at a python "
                       f"executable, or unset it; {FIX[name]}"}
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not lines:
        err = [line for line in out.stderr.splitlines() if line.strip()]
        return {
            "installed": False,
            "error": err[-1] if err else f"probe exited {out.returncode}",
            "fix": FIX[name],
        }
    facts = json.loads(lines[-1])
    facts["installed"] = True
    facts["python"] = exe
    return facts


def find_framework(name: str, python: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether ``name``'s modules are installed, without importing them (cheaper than a probe;
    enough where no GPU question is asked). Same shape as ``probe_framework``'s answer. A framework
    that runs under another interpreter is probed there."""
    import importlib.util

    if frameworks.get(name).python(python):
        return probe_framework(name, python=python)
    for module in frameworks.get(name).import_names:
        if importlib.util.find_spec(module) is None:
            return {"installed": False, "error": f"No module named {module!r}", "fix": FIX[name]}
    return {"installed": True}


def find_tool(name: str) -> str | None:
    """``nsys``/``ncu`` on PATH, else in the usual Nsight and CUDA install folders (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    patterns = [
        f"/opt/nvidia/nsight-systems*/*/bin/{name}",
        f"/opt/nvidia/nsight-systems/*/bin/{name}",
        f"/opt/nvidia/nsight-compute/*/{name}",
        f"/opt/nvidia/nsight-compute*/{name}",
        f"/usr/local/cuda*/bin/{name}",
    ]
    hits = sorted({p for pat in patterns for p in glob.glob(pat) if os.access(p, os.X_OK)}, reverse=True)
    return hits[0] if hits else None


def collect(python: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the doctor reports, as one JSON-able dict (``python``: ``--python`` NAME=PATH)."""
    gpus = gpuinfo.query()
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu": gpuinfo.cpu_model(),
        "gpu": gpus.to_dict(),
        "frameworks": {name: probe_framework(name, python=python, look_in_nox=True) for name in frameworks.FRAMEWORKS},
        "profilers": {},
        "missing": [],
        "notes": [],  # facts about this machine that are not faults (a CPU-only machine)
    }
    for tool in ("nsys", "ncu"):
        path = find_tool(tool)
        report["profilers"][tool] = path
        # kernelmap runs both on CUDA work only (the nsys pass is skipped on the CPU): without a GPU
        # their absence is a fact about the machine, not something to fix
        if path is None and not gpus.gpus:
            report["notes"].append({"what": tool, "note": "not found; kernelmap uses it on GPU work only, so it is "
                                                          f"not needed on this machine ({FIX[tool]} where there is a GPU)"})
        elif path is None:
            report["missing"].append({"what": tool, "fix": FIX[tool]})
    for name, facts in report["frameworks"].items():
        if not facts["installed"]:
            report["missing"].append({"what": name, "fix": facts["fix"], "error": facts["error"]})
        elif (found := facts.get("python", sys.executable)) != (frameworks.get(name).python(python) or sys.executable):
            report["notes"].append({"what": name, "note": f"found in {found}: `kernelmap run` outside nox "
                                                          f"needs --python {name}={found}"})
    if not gpus.gpus:
        report["notes"].append(
            {"what": "NVIDIA GPU", "note": "none here, so every framework runs on the CPU (oneDNN/BLAS calls, no "
                                           "kernels); the GPU figures need a machine with an NVIDIA GPU and driver",
             "why": gpus.problem})
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    cc_tuple = tuple(int(x) for x in cc.split(".")) if cc else None
    report["gpu_use"] = {}
    for name, facts in report["frameworks"].items():
        if not facts["installed"]:
            continue
        v = frameworks.get(name).gpu_verdict(facts, cc_tuple, gpus.problem)
        report["gpu_use"][name] = {"usable": v.usable, "why": v.why, "fix": v.fix}
        if gpus.gpus and not v.usable and v.fix:  # a GPU is here and this framework cannot use it
            report["missing"].append({"what": f"{name} on the GPU", "fix": v.fix, "error": v.why})
    # what each framework's own options (PyTorch's --custom-op routes) need here: optional variants, so
    # nothing in them is counted as missing for kernelmap itself
    report["options"] = {name: d.option_tools(bool(gpus.gpus)) for name, d in frameworks.REGISTRY.items()
                         if d.option_tools is not None}
    return report


def _print_text(r: dict[str, Any]) -> None:
    print(f"python      {r['python']} ({r['executable']})")
    print(f"cpu         {r['cpu']}")
    gpus = r["gpu"]["gpus"]
    if gpus:
        for g in gpus:
            print(f"gpu {g['index']}       {g['name']}  sm {g['compute_capability']}  driver {g['driver']}")
        print(f"cuda driver {r['gpu']['cuda_driver_version']}")
    else:
        print(f"gpu         none ({r['gpu']['problem']})")
    for name, f in r["frameworks"].items():
        if not f["installed"]:
            print(f"{name:<11} MISSING: {f['error']}")
            continue
        facts = ", ".join(f"{k}: {v}" for k, v in f.items() if k not in ("installed", "version", "devices", "python")
                          and not isinstance(v, dict | list))
        use = r["gpu_use"].get(name)
        # with no GPU at all the reason is said once, on the gpu line, not once per framework
        gpu = "" if use is None else ("; GPU: usable" if use["usable"] else
                                      "; GPU: none here" if not gpus else f"; GPU: no ({use['why']})")
        where = "" if f.get("python") in (None, sys.executable) else f"  [{f['python']}]"
        print(f"{name:<11} {f['version']}  ({facts}{gpu}){where}")
    for tool, path in r["profilers"].items():
        print(f"{tool:<11} {path or 'not found'}")
    for name, tools in r["options"].items():
        for line in frameworks.get(name).option_tool_lines(tools):
            print(line)
    if r["notes"]:
        print("\non this machine:")
        for item in r["notes"]:
            print(f"  {item['what']}: {item['note']}")
    if r["missing"]:
        print("\nmissing:")
        for item in r["missing"]:
            print(f"  {item['what']}: {item['fix']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH",
                        help="interpreter to probe that framework with (else KERNELMAP_PYTHON_<FRAMEWORK>, else "
                             "the checkout's .nox/<framework>-workers or .nox/frameworks, else this one)")


def main(args: argparse.Namespace) -> int:
    try:
        python = frameworks.parse_python(args.python)
    except ValueError as exc:
        raise KernelmapError(str(exc)) from None
    report = collect(python)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_text(report)
    return 0
