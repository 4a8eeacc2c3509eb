"""Compiling pdfleet's Triton kernels for a CUDA architecture on a machine without a GPU, and reading back what
the compiler made of them: the PTX instructions, and the registers and spills ptxas reports.

Triton's wheel carries ptxas (and a Blackwell build of it), so the whole pipeline down to a cubin runs on a CPU;
only loading and launching the cubin needs the device.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@dataclasses.dataclass(frozen=True)
class Compiled:
    target: str
    ptx: str
    registers: int
    spill_stores: int
    spill_loads: int

    def uses(self, instruction: str) -> bool:
        return re.search(rf"\b{re.escape(instruction)}\b", self.ptx) is not None


def compile_for(body: Callable[..., None], signature: dict[str, str], constexprs: dict[str, object],
                capability: int, num_warps: int = 4) -> Compiled:
    """`body` (an undecorated kernel) compiled for sm_`capability`; `signature` maps each runtime argument to
    Triton's type string (e.g. "*bf16", "i32")."""
    fn = triton.jit(body)
    names = fn.arg_names
    full = {name: "constexpr" if name in constexprs else signature[name] for name in names}
    source = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps})
    ptx = kernel.asm["ptx"]
    target = re.search(r"\.target (\S+)", ptx)
    assert target is not None, "PTX without a .target line"
    ptxas = knobs.nvidia.ptxas_blackwell.path if capability >= 100 else knobs.nvidia.ptxas.path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([ptxas, "-v", f"--gpu-name={target.group(1)}", str(path), "-o", str(path) + ".o"],
                                capture_output=True, text=True, check=True).stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        assert found is not None, f"ptxas -v said nothing matching {pattern!r}:\n{report}"
        return int(found.group(1))

    return Compiled(target=target.group(1), ptx=ptx, registers=number(r"Used (\d+) registers"),
                    spill_stores=number(r"(\d+) bytes spill stores"), spill_loads=number(r"(\d+) bytes spill loads"))
