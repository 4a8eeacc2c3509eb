"""One Triton kernel body, compiled for CUDA tensors and run by Triton's interpreter for CPU tensors.

The interpreter is what lets `make test` check the kernels on a machine without a GPU. It cannot do bf16
arithmetic (a bf16 dot multiplies raw bit patterns), so kernels take a CAST flag: on CPU every load is cast to
fp32 first; on a GPU bf16 operands go to the tensor cores as they are, whose products of two bf16 values are
exact in the fp32 accumulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# The interpreter runs tl.reduce with this combine function as numpy's sum; tl.sum itself is a jit function
# that only an interpreter-mode import of Triton (TRITON_INTERPRET=1 before the import) could call on CPU.
SUM = tl.standard._sum_combine


class Kernel:
    """A kernel body (an undecorated function written in Triton's language) and its two runners."""

    def __init__(self, body: Callable[..., None]) -> None:
        self.body = body
        self._compiled: Any = None
        self._interpreted: Any = None

    def on(self, device: torch.device) -> Any:
        """The runner for tensors on `device`: index it with a grid, then call it."""
        if device.type == "cpu":
            if self._interpreted is None:
                self._interpreted = InterpretedFunction(self.body)
            return self._interpreted
        if device.type != "cuda":
            raise ValueError(f"pdfleet's indexer kernels run on CUDA or, interpreted, on CPU; not on {device}")
        if self._compiled is None:
            self._compiled = triton.jit(self.body)
        return self._compiled


def cast_to_fp32(*tensors: torch.Tensor) -> bool:
    """Whether the kernel must cast its loads to fp32: on CPU (the interpreter), or for fp32 inputs."""
    return any(t.device.type == "cpu" or t.dtype == torch.float32 for t in tensors)


# Columns a row of logits is padded to, as DeepGEMM pads its own (1 KiB of fp32).
ROW_ALIGN = 256


def logits_buffer(rows: int, width: int, device: torch.device) -> torch.Tensor:
    """fp32 [rows, width] whose rows start a multiple of 256 columns apart, laid out as DeepGEMM lays out the
    logits it returns: SGLang's top-k transforms take a padded view, require a 16-byte-aligned row stride, and
    mask a few columns past a row's window in place."""
    stride = -(-width // ROW_ALIGN) * ROW_ALIGN
    return torch.empty(rows, stride, dtype=torch.float32, device=device)[:, :width]


def pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(n))
