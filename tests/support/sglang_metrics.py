"""The Prometheus metrics SGLang 0.5.23 declares, read from its source (`sglang/srt/observability/
metrics_collector.py` in the installed package) without importing it: importing SGLang costs 10-20 s of CPU, and
its collectors need a published runtime context to be built.

For every `Gauge`, `Counter`, `Histogram` or `Summary` whose `name=` is a literal `sglang:...`: its family name (a
counter's without `_total`, as prometheus_client names it), its type, its label names (the collector's own
labels: the scheduler's from `SchedulerMetricsCollector.init_new`, the tokenizer manager's from
`tokenizer_metric_labels`, without the optional ones that only priority scheduling, DP or extra labels add) and,
for a histogram, its default buckets.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
from pathlib import Path

SOURCE = "sglang/srt/observability/metrics_collector.py"
_KINDS = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary"}


@dataclasses.dataclass(frozen=True)
class Declared:
    name: str  # the family name, as prometheus_client's parser reports it
    kind: str
    labels: frozenset[str] | None  # None: set by something other than the collector's labels
    buckets: tuple[float, ...] | None
    collector: str  # the class that declares it


def source() -> Path:
    return Path(str(importlib.metadata.distribution("sglang").locate_file(SOURCE)))


def _dict_keys(tree: ast.AST, function: str, variable: str) -> frozenset[str]:
    """The literal keys of the first dict literal assigned to `variable` in `function`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for assign in ast.walk(node):
                if (isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == variable for t in assign.targets)):
                    return frozenset(ast.literal_eval(k) for k in assign.value.keys if k is not None)
    raise AssertionError(f"no dict assigned to {variable} in {function} of {SOURCE}: has SGLang changed?")


def _label_names(node: ast.expr | None, base: frozenset[str]) -> frozenset[str] | None:
    """The label names an expression such as `labels.keys()` or `[*labels.keys(), "is_streaming"]` makes, with
    `labels` the collector's base labels; None where it needs more than that to evaluate."""
    if node is None:
        return frozenset()
    try:
        names = eval(compile(ast.Expression(node), SOURCE, "eval"),  # SGLang's own label expression, nothing else
                     {"__builtins__": {"list": list, "set": set, "tuple": tuple}, "labels": dict.fromkeys(base)})
    except (NameError, AttributeError, TypeError):
        return None
    return frozenset(str(n) for n in names)


def _buckets(cls: ast.ClassDef, node: ast.expr | None) -> tuple[float, ...] | None:
    """A histogram's default buckets: a literal, or a variable the class assigns a literal list to."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        for assign in ast.walk(cls):
            if (isinstance(assign, ast.Assign) and isinstance(assign.value, ast.List)
                    and any(isinstance(t, ast.Name) and t.id == node.id for t in assign.targets)):
                return tuple(float(v) for v in ast.literal_eval(assign.value))
        return None
    try:
        return tuple(float(v) for v in ast.literal_eval(node))
    except ValueError:
        return None


def declared() -> dict[str, Declared]:
    """Every `sglang:` metric of SGLang's scheduler and tokenizer-manager collectors, by family name."""
    tree = ast.parse(source().read_text())
    bases = {"SchedulerMetricsCollector": _dict_keys(tree, "init_new", "labels"),
             "TokenizerMetricsCollector": _dict_keys(tree, "tokenizer_metric_labels", "labels")}
    out: dict[str, Declared] = {}
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in bases):
            continue
        for call in ast.walk(cls):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in _KINDS):
                continue
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            name = kw.get("name")
            if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
                continue
            kind = _KINDS[call.func.id]
            family = str(name.value)
            if kind == "counter" and family.endswith("_total"):
                family = family[: -len("_total")]
            out[family] = Declared(family, kind, _label_names(kw.get("labelnames"), bases[cls.name]),
                                   _buckets(cls, kw.get("buckets")) if kind == "histogram" else None, cls.name)
    return out
