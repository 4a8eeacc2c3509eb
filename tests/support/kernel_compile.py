"""Compiling pdfleet's Triton kernels for a CUDA architecture on a machine without a GPU, exactly as a launch
from their wrappers would, and reading back what the compiler made of them.

`compiling(capability)` replaces a kernel's runner: calling `paged_logits` or `ragged_logits` then compiles
instead of launching, with the arguments the wrapper passes, specialised as Triton specialises a real launch
(16-byte-aligned pointers and integers divisible by 16 marked so, integers equal to 1 folded), which is what lets
the compiler vectorise and pipeline loads. Triton's wheel carries ptxas (and a Blackwell build of it), so the
pipeline runs down to a cubin on a CPU; only loading and launching it needs the device.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import triton
from triton import knobs
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import native_specialize_impl

from pdfleet.kernels import launch


@dataclasses.dataclass(frozen=True)
class Compiled:
    target: str
    ptx: str
    registers: int
    spill_stores: int
    spill_loads: int

    def count(self, instruction: str) -> int:
        """How many PTX instructions (predicated or not) start with `instruction` ("cp.async.cg.shared.global")."""
        return len(re.findall(rf"^\s*(?:@!?%\w+\s+)?{re.escape(instruction)}\b", self.ptx, flags=re.MULTILINE))

    def uses(self, instruction: str) -> bool:
        return self.count(instruction) > 0


def compile_call(body: Callable[..., None], args: tuple[Any, ...], constants: dict[str, Any], capability: int,
                 num_warps: int = 4) -> Compiled:
    """`body` compiled for sm_`capability` as a launch with these arguments would compile it."""
    fn = triton.jit(body)
    signature: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    values = [*args, *(constants[name] for name in fn.arg_names[len(args):])]
    for index, (name, value) in enumerate(zip(fn.arg_names, values, strict=True)):
        if name in constants:
            signature[name], constexprs[(index,)] = "constexpr", value
            continue
        kind, key = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":  # an integer 1, folded as a real launch folds it
            constexprs[(index,)] = key
        else:
            attrs[(index,)] = BaseBackend.parse_attr(key)
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", capability, 32),
                            options={"num_warps": num_warps})
    return _assembled(kernel.asm["ptx"], capability)


def _assembled(ptx: str, capability: int) -> Compiled:
    target = re.search(r"\.target (\S+)", ptx)
    assert target is not None, "PTX without a .target line"
    ptxas = knobs.nvidia.ptxas_blackwell.path if capability >= 100 else knobs.nvidia.ptxas.path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([ptxas, "-v", f"--gpu-name={target.group(1)}", str(path), "-o", f"{path}.o"],
                                capture_output=True, text=True, check=True).stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        assert found is not None, f"ptxas -v said nothing matching {pattern!r}:\n{report}"
        return int(found.group(1))

    return Compiled(target=target.group(1), ptx=ptx, registers=number(r"Used (\d+) registers"),
                    spill_stores=number(r"(\d+) bytes spill stores"), spill_loads=number(r"(\d+) bytes spill loads"))


class _CompilingRunner:
    def __init__(self, body: Callable[..., None], capability: int, into: list[Compiled]) -> None:
        self.body, self.capability, self.into = body, capability, into

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def run(*args: Any, num_warps: int = 4, **constants: Any) -> None:
            self.into.append(compile_call(self.body, args, constants, self.capability, num_warps))
        return run


@contextmanager
def compiling(monkeypatch: pytest.MonkeyPatch, capability: int) -> Iterator[list[Compiled]]:
    """Within the block, pdfleet's kernels compile for sm_`capability` instead of running, with the constants a
    GPU launch of the same (bf16) inputs would use; each compiled kernel is appended to the yielded list."""
    compiled: list[Compiled] = []
    monkeypatch.setattr(launch.Kernel, "on", lambda self, device: _CompilingRunner(self.body, capability, compiled))
    monkeypatch.setattr(launch, "cast_to_fp32", lambda *tensors: False)
    for module in ("pdfleet.kernels.paged", "pdfleet.kernels.ragged"):
        monkeypatch.setattr(f"{module}.cast_to_fp32", lambda *tensors: False)
    yield compiled
    counts = collections.Counter(c.target for c in compiled)
    assert counts, "nothing was compiled"
