"""Where an object's class comes from when the class holding it does not say.

graph.py reads an attribute's class off `self.attr = ...` and the annotations of the holder's own class. SGLang
hands its workers, runners and process groups around in ways that say nothing there, and the scan stopped at each:
the weight-group routes' process groups sit behind `self.tp_worker.model_runner.weight_updater`, where the
manager's `tp_worker` is a dataclass field typed `Any` and the worker's `model_runner` a property. Resolved here,
each from the source, in three kinds a scan can switch off one by one (tests/unit/test_desync_scan.py shows what
each one finds):

- `holders`: a property's getter (its return annotation, else what it returns); an attribute a constructor
  parameter fills (a dataclass field, `self.attr = param`) takes the class of each argument passed for it wherever
  the class is constructed under srt/ (`SchedulerWeightUpdaterManager(tp_worker=self.tp_worker)`); calling an
  instance calls its `__call__`, or a torch module's `forward`.
- `accessors`: a module global's annotation or constructor (`_WORLD: Optional[GroupCoordinator]`,
  `_PARALLEL = ParallelContext()`); an unannotated function's `return` values; attributes a class answers through
  `__getattr__` (SGLang's `ParallelContext`: `get_parallel().tp_group`), learned from the annotated accessors that
  return them (`def get_tp_group() -> GroupCoordinator: return get_parallel().tp_group`).
- `model`: `ModelRunner.model` is what the model registry loads for the checkpoint's architecture, so any
  `EntryClass` of `sglang.srt.models`. This is the one holder written by hand (`MODEL_HOLDERS`): the registry picks
  the class by a string from the checkpoint's config, which no reading of the source can follow. The models'
  `forward` (and calling the model) is not entered: it is the forward, out of the audit's scope, and entering it
  for 200-odd models would multiply the scan for rows that all say so.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from tests.support.desync_scan.index import Class, Function, Index, Module

if TYPE_CHECKING:
    from tests.support.desync_scan.graph import Graph

KINDS = frozenset({"holders", "accessors", "model"})
MODEL_HOLDERS = frozenset({("sglang.srt.model_executor.model_runner.ModelRunner", "model")})
MODELS_PACKAGE = "sglang.srt.models."
MODEL_BOUNDARY = frozenset({"forward", "__call__"})
_PROPERTIES = frozenset({"property", "cached_property"})
_TORCH_MODULES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
_ENTRY_CLASS = re.compile(r"^EntryClass\s*=", re.M)


def returned(function: Function) -> list[ast.expr]:
    return [n.value for n in function.body_nodes if isinstance(n, ast.Return) and n.value is not None]


def is_property(function: Function) -> bool:
    return any(ast.unparse(d).split(".")[-1] in _PROPERTIES for d in function.node.decorator_list)


def return_types(graph: Graph, function: Function, self_class: Class | None) -> set[Class]:
    """A function's return annotation; without one (and with `accessors` on), the classes of what it returns."""
    from tests.support.desync_scan.graph import Node

    if function.node.returns is not None or "accessors" not in graph.kinds:
        return graph.annotation_types(function.node.returns, function.module)
    key = (id(function), id(self_class))
    if key not in graph.returns:
        graph.returns[key] = set()  # a function returning its own call sees nothing, not a loop
        scope = Node(function, self_class)
        graph.returns[key] = set().union(*(graph.expr_types(v, scope) for v in returned(function)))
    return graph.returns[key]


def property_types(graph: Graph, cls: Class, attr: str) -> set[Class]:
    getter = cls.lookup(attr)
    return return_types(graph, getter, cls) if getter is not None and is_property(getter) else set()


def _filling_parameter(cls: Class, attr: str) -> str | None:
    """The constructor parameter that fills `attr`: a dataclass field of that name, or `self.attr = param` in an
    `__init__` of the class or its bases."""
    for owner in cls.mro:
        if attr in owner.annotations and any("dataclass" in ast.unparse(d) for d in owner.node.decorator_list):
            return attr
        for method, _, value in owner.assignments.get(attr, ()):
            if (method.node.name == "__init__" and isinstance(value, ast.Name)
                    and value.id in {a.arg for a in [*method.node.args.args, *method.node.args.kwonlyargs]}):
                return value.id
    return None


def construction_sites(graph: Graph, cls: Class) -> list[tuple[Function, ast.Call]]:
    """Each call that constructs `cls`, anywhere under srt/."""
    if id(cls) not in graph.constructions:
        name = cls.node.name
        graph.constructions[id(cls)] = [
            (function, call) for module in graph.index.modules_calling(name)
            for function, call in module.calls_by_name.get(name, ())
            if graph.index.resolve_expr_name(call.func, module) is cls]
    return graph.constructions[id(cls)]


def constructor_types(graph: Graph, cls: Class, attr: str) -> set[Class]:
    from tests.support.desync_scan.graph import Node

    parameter = _filling_parameter(cls, attr)
    if parameter is None:
        return set()
    found: set[Class] = set()
    for function, call in construction_sites(graph, cls):
        scope = Node(function, function.owner)
        for keyword in call.keywords:
            if keyword.arg == parameter:
                found |= graph.expr_types(keyword.value, scope)
    return found


def instance_call(classes: set[Class]) -> list[tuple[Function, Class]]:
    """What calling an instance of one of `classes` runs, with the class `self` is: its `__call__`, or a torch
    module's `forward`."""
    targets: list[tuple[Function, Class]] = []
    for cls in sorted(classes, key=lambda c: c.qualname):
        torch_module = any(base in _TORCH_MODULES for c in cls.mro for base in c.external_bases)
        method = cls.lookup("__call__") or (cls.lookup("forward") if torch_module else None)
        if method is not None:
            targets.append((method, cls))
    return targets


def global_types(graph: Graph, module: Module, name: str, depth: int = 0) -> set[Class]:
    """A module global's class: its annotation, its constructor or builder's return; through imports."""
    if name in module.annotations or name in module.variables:
        found = graph.annotation_types(module.annotations.get(name), module)
        value = module.variables.get(name)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute):
            built = graph.index.resolve_expr_name(value.func, module)
            if isinstance(built, Class):
                found.add(built)
            elif isinstance(built, Function):
                found |= return_types(graph, built, built.owner)
        return found
    if name in module.imports and depth < 10:
        home, _, variable = module.imports[name].rpartition(".")
        if (source := graph.index.module(home)) is not None:
            return global_types(graph, source, variable, depth + 1)
    return set()


def getattr_types(graph: Graph, cls: Class, attr: str) -> set[Class]:
    """An attribute `cls` answers through `__getattr__`, from each annotated module function that returns it read
    off an instance of `cls`."""
    from tests.support.desync_scan.graph import Node

    if not any("__getattr__" in c.methods for c in cls.mro):
        return set()
    found: set[Class] = set()
    for module in graph.index.accessor_modules(attr):
        for function in module.functions.values():
            if function.node.returns is None:
                continue
            for value in returned(function):
                if (isinstance(value, ast.Attribute) and value.attr == attr
                        and cls in graph.expr_types(value.value, Node(function, None))):
                    found |= graph.annotation_types(function.node.returns, module)
    return found


def model_classes(index: Index) -> list[Class]:
    """Every `EntryClass` of the model modules: what the registry may load."""
    found: list[Class] = []
    for module in index.modules_matching(_ENTRY_CLASS):
        value = module.variables.get("EntryClass") or module.aliases.get("EntryClass")
        if not module.name.startswith(MODELS_PACKAGE) or value is None:
            continue
        for element in value.elts if isinstance(value, ast.List | ast.Tuple) else [value]:
            symbol = index.resolve_expr_name(element, module)
            if isinstance(symbol, Class) and symbol not in found:
                found.append(symbol)
    return found


def holds_model(cls: Class, attr: str) -> bool:
    return any((owner.qualname, attr) in MODEL_HOLDERS for owner in cls.mro)
