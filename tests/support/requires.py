"""Tests that need a tool fail, never skip, when it is missing, and say how to get it (GPU-only tests aside)."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from types import ModuleType

import pytest

HOW = {
    "sglang": "run `make sglang` (hack/install-sglang.sh)",
    "torch": "run `make sglang` (hack/install-sglang.sh installs torch for CPU)",
    "triton": "run `make sglang` (hack/install-sglang.sh installs triton with torch)",
    "strace": "install strace (apt-get install strace)",
}


def module(name: str) -> ModuleType:
    top = name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        pytest.fail(f"{top} is not installed: {HOW.get(top, f'pip install {top}')}", pytrace=False)
    return importlib.import_module(name)


def installed(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.fail(f"{name} is not installed: {HOW.get(name, f'pip install {name}')}", pytrace=False)


def program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: {HOW.get(name, f'install {name}')}", pytrace=False)
    return path
