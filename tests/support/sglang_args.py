"""SGLang server command lines, parsed by SGLang's own parser (the real sglang 0.5.23, CPU-only).

The operator renders engine command lines; these helpers let tests check them against the parser that
the engine itself will run, instead of against our idea of it. Install sglang first with
``hack/install-sglang.sh``.

How ServerArgs works in sglang 0.5.23 (checked on a CPU-only machine):

* ``ServerArgs`` is a ``msgspec.Struct`` (not a dataclass). ``ServerArgs.add_cli_args(parser)`` registers
  every flag; parsing needs no GPU and no model.
* ``ServerArgs.from_cli_args(namespace)`` only builds the record: its ``__post_init__`` is a no-op in
  0.5.23 and touches neither GPUs nor the model path. So ``build_server_args`` works on a CPU for any
  command line, including ``--model-path /models/x`` that does not exist here.
* The derived values (device, attention backend, memory fraction, page size, the disabled radix cache of a
  decode server, ...) come from ``ServerArgs.resolve_once()``, which the engine launcher calls. It reads
  the model's ``config.json``, sets process environment variables, and freezes the record; read the
  result with ``resolved_dict()`` (the fields themselves keep the raw input). On a CPU it works when
  (a) ``--model-path`` is ``dummy``/``none`` (the pipeline returns before any model-specific step) or a
  local directory with a ``config.json``, and (b) ``--device cpu`` is given: without it SGLang's
  ``get_device()`` raises "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is
  available". A model path that is not a local directory is taken as a Hugging Face repository id and
  would be fetched from the Hub, so ``resolve_server_args`` refuses it. With a local config and
  ``--device cpu`` it resolves, for example, ``attention_backend='torch_native'`` (no Intel AMX here).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

INSTALL_HINT = "sglang 0.5.23 is not installed in this Python environment: run hack/install-sglang.sh"


class SGLangArgsError(ValueError):
    """SGLang's parser (or its resolution) rejected a command line; ``message`` is SGLang's own text."""

    def __init__(self, message: str, argv: Sequence[str]) -> None:
        self.message = message
        self.argv = list(argv)
        super().__init__(f"{message} (argv: {' '.join(self.argv)})")


class _ArgparseExit(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RaisingArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing usage and calling sys.exit."""

    def error(self, message: str) -> NoReturn:
        raise _ArgparseExit(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ArgparseExit((message or "").strip() or f"argparse exited with status {status}")


def _server_args_class() -> type[ServerArgs]:
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as exc:
        raise RuntimeError(f"{INSTALL_HINT} ({exc})") from exc
    return ServerArgs


def build_parser() -> argparse.ArgumentParser:
    """A fresh parser with exactly the flags SGLang registers (``ServerArgs.add_cli_args``)."""
    parser = _RaisingArgumentParser(prog="sglang serve")
    _server_args_class().add_cli_args(parser)
    return parser


def parse_server_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (flags only, without ``python -m sglang.launch_server``) like ``sglang serve`` does.

    Raises SGLangArgsError carrying argparse's message (for example "unrecognized arguments: --x") when
    SGLang rejects the line, instead of letting argparse call sys.exit.
    """
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        raise SGLangArgsError("--config files are merged by SGLang's launcher, not here: pass flags", argv)
    try:
        namespace = build_parser().parse_args(list(argv))
    except _ArgparseExit as exc:
        raise SGLangArgsError(exc.message, argv) from None
    # As sglang.srt.server_args.prepare_server_args does after parsing.
    namespace._radix_eviction_policy_explicitly_set = any(
        a == "--radix-eviction-policy" or a.startswith("--radix-eviction-policy=") for a in argv
    )
    return namespace


def build_server_args(argv: list[str]) -> ServerArgs:
    """The unresolved ``ServerArgs`` that ``prepare_server_args(argv)`` returns, without its side effects.

    SGLang's ``prepare_server_args`` also reconfigures the root logger (``logging.basicConfig(force=True)``)
    and records the launch command; neither belongs in a test process. Works on a CPU for any line.
    """
    return _server_args_class().from_cli_args(parse_server_args(argv))


@contextmanager
def _restored_environ() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def resolve_server_args(argv: list[str]) -> ServerArgs:
    """``build_server_args`` plus SGLang's own resolution (``resolve_once``), on a CPU.

    Needs ``--device cpu`` and a ``--model-path`` that is ``dummy``/``none`` or a local directory with a
    ``config.json`` (see the module docstring for why). Read derived values from ``.resolved_dict()``.
    The environment variables that resolution sets are undone afterwards. Raises SGLangArgsError when
    SGLang rejects the line, with SGLang's exception as ``__cause__``.
    """
    server_args = build_server_args(argv)
    if server_args.device is None:
        raise SGLangArgsError(
            "resolution without an accelerator needs --device cpu (SGLang's get_device() raises otherwise)",
            argv,
        )
    model_path = str(server_args.model_path)
    if model_path.lower() not in ("dummy", "none") and not (Path(model_path) / "config.json").is_file():
        raise SGLangArgsError(
            f"--model-path {model_path} is neither dummy/none nor a local directory with a config.json; "
            "SGLang would fetch it from the Hugging Face Hub",
            argv,
        )
    try:
        with _restored_environ():
            server_args.resolve_once()
    except Exception as exc:
        raise SGLangArgsError(
            f"SGLang rejected the arguments at resolution: {type(exc).__name__}: {exc}", argv
        ) from exc
    return server_args
