"""Static call resolution over SGLang's source: from a function's body to the functions and primitives it calls.

What is resolved: calls of nested defs, module functions and imported names (re-exports and `import *`
followed); `self.m()` through the class of `self` in the chain (a mixin method reached from the Scheduler
resolves `self` as the Scheduler, with all its mixins) and `super().m()`; `obj.attr.m()` where the class of
`attr` is inferred from assignments to `self.attr` in any method of the class and its bases (a constructor
call, an annotation, a function's return annotation) or from class-level annotations; local variables
assigned the same way and annotated parameters; constructors (`Cls(...)` follows `Cls.__init__`);
attributes holding callables: a `TypeBasedDispatcher` table (calling it may call every handler in it), a
bound method or lambda assigned to the attribute, and a constructor parameter stored in an attribute (a
callback: resolved at the call sites that construct the class, in the modules parsed so far).

What is not: calls whose receiver's class cannot be inferred (each is counted, `Graph.unresolved`), getattr and
other reflection, callables read from containers other than the dispatcher, properties (attribute reads that
run code), and code run on other threads (a `Thread(target=...)` is not an edge: the thread does not run in
the loop's order). docs/desync-audit.md says how each is covered.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.support.desync_scan import holders, primitives
from tests.support.desync_scan.index import Class, Function, Index, Module, Symbol

_BUILTINS = frozenset(dir(builtins))
_MAX_CONDITION = 200


@dataclass(frozen=True)
class Node:
    """A function as the chain reaches it: `self_class` is the class `self` is at that point of the chain.
    Also the scope names in its body are resolved in."""

    function: Function
    self_class: Class | None

    @property
    def name(self) -> str:
        return self.function.qualname

    @property
    def module(self) -> Module:
        return self.function.module

    def __hash__(self) -> int:
        return hash((id(self.function), id(self.self_class)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Node) and other.function is self.function
                and other.self_class is self.self_class)


@dataclass(frozen=True)
class Primitive:
    name: str  # torch.distributed.all_reduce, GroupCoordinator.barrier, ?.barrier (receiver not inferred), ...


@dataclass(frozen=True)
class Site:
    """One call in a function's body and what it resolved to."""

    line: int
    text: str
    conditions: tuple[str, ...]
    targets: tuple[Node | Primitive, ...]
    unresolved: bool  # could be SGLang code, but the callee was not found
    dispatch: bool = False  # a call of a dispatcher table: its targets are handlers


@dataclass
class Graph:
    index: Index
    kinds: frozenset[str] = holders.KINDS  # which of holders.py's resolutions are on
    returns: dict[tuple[int, int], set[Class]] = field(default_factory=dict)
    constructions: dict[int, list[tuple[Function, ast.Call]]] = field(default_factory=dict)
    boundary: set[str] = field(default_factory=set)  # model methods not entered (holders.MODEL_BOUNDARY)
    _sites: dict[Node, list[Site]] = field(default_factory=dict)
    _attr_types: dict[tuple[int, str], set[Class]] = field(default_factory=dict)
    _callables: dict[tuple[int, str], list[Node | Primitive]] = field(default_factory=dict)
    _locals: dict[tuple[int, int], dict[str, set[Class]]] = field(default_factory=dict)
    _model_set: set[Class] | None = None

    # ---- sites -------------------------------------------------------------------------------------------

    def sites(self, node: Node) -> list[Site]:
        if node not in self._sites:
            self._sites[node] = []  # a recursive resolution sees no sites instead of looping
            self._sites[node] = self._resolve_sites(node)
        return self._sites[node]

    def _resolve_sites(self, node: Node) -> list[Site]:
        scope = node
        parents = _parents(node.function.node)
        found = []
        for call in node.function.calls:
            targets, unresolved, dispatch = self.resolve_call(call, scope)
            if targets or unresolved:
                found.append(Site(call.lineno, _short(ast.unparse(call.func)), _conditions(call, parents),
                                  tuple(targets), unresolved, dispatch))
        return found

    def resolve_call(self, call: ast.Call, scope: Node) -> tuple[list[Node | Primitive], bool, bool]:
        """(targets, unresolved, through a dispatcher) of one call."""
        func = call.func
        if isinstance(func, ast.Name):
            return self._resolve_name_call(func.id, scope)
        if not isinstance(func, ast.Attribute):
            return [], False, False
        value, method = func.value, func.attr
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            owner = scope.function.owner
            if scope.self_class is not None and owner is not None:
                found = scope.self_class.lookup(method, after=owner)
                return ([Node(found, scope.self_class)] if found else []), found is None, False
            return [], True, False
        symbol = self._static_symbol(value, scope)
        if isinstance(symbol, Module):
            return self._from_symbol(self.index._in_module(symbol, [method], 0), scope)
        if isinstance(symbol, Class):
            found = symbol.lookup(method)
            return ([Node(found, symbol)] if found else []), found is None, False
        if isinstance(symbol, str):
            return self._external(f"{symbol}.{method}")
        classes = self.expr_types(value, scope)
        if not (isinstance(value, ast.Name) and value.id == "self"):
            # The inferred class is often a base (BasePrefixCache, a KV receiver's base) and the object one of
            # its subclasses, chosen by configuration: each subclass's override is a possible callee.
            classes |= {sub for cls in classes for sub in self.index.subclasses(cls)}
        targets: list[Node | Primitive] = []
        dispatch = False
        models = self._models(classes)
        for cls in sorted(classes, key=lambda c: c.qualname):
            if primitive := _coordinator_primitive(cls, method):
                targets.append(primitive)
            elif cls in models and method in holders.MODEL_BOUNDARY:
                self.boundary.add(f"{cls.qualname}.{method}")
            elif found := cls.lookup(method):
                if Node(found, cls) not in targets and not any(
                        isinstance(t, Node) and t.function is found for t in targets):
                    targets.append(Node(found, cls))
            elif bound := self.callable_attr(cls, method):
                targets.extend(bound)
                dispatch = dispatch or self._is_dispatcher(cls, method)
            elif "holders" in self.kinds:
                targets.extend(self._instance_call(self.attr_types(cls, method)))
        if not targets and method in primitives.BY_NAME:
            return [Primitive(f"?.{method}")], False, False
        return targets, not targets and not _builtin_method(method), dispatch

    def _resolve_name_call(self, name: str, scope: Node) -> tuple[list[Node | Primitive], bool, bool]:
        function: Function | None = scope.function
        while function is not None:
            if name in function.nested:
                return [Node(function.nested[name], scope.self_class)], False, False
            function = function.outer
        if name in self._locals_of(scope):
            # A local holding an instance runs its __call__ / forward; other local callables are not followed.
            held = self._locals_of(scope)[name]
            return (self._instance_call(held) if "holders" in self.kinds else []), False, False
        symbol = self.index.resolve_expr_name(ast.Name(name), scope.module)
        if symbol is None:
            return [], name not in _BUILTINS, False
        return self._from_symbol(symbol, scope)

    def _from_symbol(self, symbol: Symbol | None, scope: Node) -> tuple[list[Node | Primitive], bool, bool]:
        if symbol is None:
            return [], True, False
        if isinstance(symbol, str):
            return self._external(symbol)
        if isinstance(symbol, Function):
            if symbol.qualname in primitives.GROUP_HELPERS:
                return [Primitive(symbol.qualname)], False, False
            self_class = symbol.owner if symbol.owner is not None else None
            return [Node(symbol, self_class)], False, False
        if isinstance(symbol, Class):
            if symbol.qualname in primitives.GROUP_HELPERS:
                return [Primitive(symbol.qualname)], False, False
            init = symbol.lookup("__init__")
            return ([Node(init, symbol)] if init else []), False, False
        return [], False, False

    def _instance_call(self, classes: set[Class]) -> list[Node | Primitive]:
        models = self._models(classes)
        self.boundary.update(f"{model.qualname}.forward" for model in models)
        return [Node(function, cls) for function, cls in holders.instance_call(classes - models)]

    def _models(self, classes: set[Class]) -> set[Class]:
        if "model" not in self.kinds or not classes:
            return set()
        if self._model_set is None:
            self._model_set = set(holders.model_classes(self.index))
        return classes & self._model_set

    @staticmethod
    def _external(dotted: str) -> tuple[list[Node | Primitive], bool, bool]:
        if name := primitives.torch_primitive(dotted):
            return [Primitive(f"torch.distributed.{name}")], False, False
        return [], False, False

    # ---- types -------------------------------------------------------------------------------------------

    def _static_symbol(self, expr: ast.expr, scope: Node) -> Symbol | None:
        """A Name/Attribute chain that names a module, class or outside name (not a local or `self`)."""
        head = expr
        while isinstance(head, ast.Attribute):
            head = head.value
        if not isinstance(head, ast.Name) or head.id == "self" or head.id in self._locals_of(scope):
            return None
        return self.index.resolve_expr_name(expr, scope.module)

    def expr_types(self, expr: ast.expr, scope: Node) -> set[Class]:
        """Classes an expression's value may be an instance of (empty when not inferred)."""
        if isinstance(expr, ast.Name):
            if expr.id == "self" and scope.self_class is not None:
                return {scope.self_class}
            local = self._locals_of(scope)
            if expr.id not in local and expr.id != "self" and "accessors" in self.kinds:
                return holders.global_types(self, scope.module, expr.id)
            return set(local.get(expr.id, ()))
        if isinstance(expr, ast.Attribute):
            symbol = self._static_symbol(expr, scope)
            if symbol is not None:
                return set()
            found: set[Class] = set()
            for cls in self.expr_types(expr.value, scope):
                found |= self.attr_types(cls, expr.attr)
            return found
        if isinstance(expr, ast.Call):
            return self._call_types(expr, scope)
        if isinstance(expr, ast.IfExp):
            return self.expr_types(expr.body, scope) | self.expr_types(expr.orelse, scope)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.expr_types(v, scope) for v in expr.values))
        return set()

    def _call_types(self, call: ast.Call, scope: Node) -> set[Class]:
        func = call.func
        if isinstance(func, ast.Name | ast.Attribute):
            symbol = self._static_symbol(func, scope) if isinstance(func, ast.Attribute) else (
                None if func.id in self._locals_of(scope) else self.index.resolve_expr_name(func, scope.module))
            if isinstance(symbol, Class):
                return {symbol}
            if isinstance(symbol, Function):
                return holders.return_types(self, symbol, symbol.owner)
            if isinstance(func, ast.Attribute) and symbol is None:
                found: set[Class] = set()
                for cls in self.expr_types(func.value, scope):
                    if method := cls.lookup(func.attr):
                        found |= holders.return_types(self, method, cls)
                return found
        return set()

    def annotation_types(self, annotation: ast.expr | None, module: Module) -> set[Class]:
        if annotation is None:
            return set()
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return set()
        if isinstance(annotation, ast.BinOp):  # X | None
            return self.annotation_types(annotation.left, module) | self.annotation_types(annotation.right, module)
        if isinstance(annotation, ast.Subscript):
            head = ast.unparse(annotation.value).split(".")[-1]
            if head in ("Optional", "Union"):
                inner = annotation.slice
                items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
                return set().union(*(self.annotation_types(i, module) for i in items))
            return set()
        if isinstance(annotation, ast.Name | ast.Attribute):
            symbol = self.index.resolve_expr_name(annotation, module)
            return {symbol} if isinstance(symbol, Class) else set()
        return set()

    def attr_types(self, cls: Class, attr: str) -> set[Class]:
        key = (id(cls), attr)
        if key in self._attr_types:
            return self._attr_types[key]
        self._attr_types[key] = set()  # guard against self-referring inference
        found: set[Class] = set()
        for owner in cls.mro:
            if attr in owner.annotations:
                found |= self.annotation_types(owner.annotations[attr], owner.module)
            for method, annotation, value in owner.assignments.get(attr, ()):
                if annotation is not None:
                    found |= self.annotation_types(annotation, method.module)
                if value is not None:
                    found |= self.expr_types(value, Node(method, cls))
        if "holders" in self.kinds:
            found |= holders.property_types(self, cls, attr)
            if not found:  # a field typed Any or a bare parameter: what its constructors pass
                found |= holders.constructor_types(self, cls, attr)
        if "accessors" in self.kinds and not found:
            found |= holders.getattr_types(self, cls, attr)
        if "model" in self.kinds and holders.holds_model(cls, attr):
            found |= set(holders.model_classes(self.index))
        self._attr_types[key] = found
        return found

    def _locals_of(self, scope: Node) -> dict[str, set[Class]]:
        key = (id(scope.function), id(scope.self_class))
        if key in self._locals:
            return self._locals[key]
        names: dict[str, set[Class]] = {}
        self._locals[key] = names
        node = scope.function.node
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        for vararg in (node.args.vararg, node.args.kwarg):
            if vararg is not None:
                names[vararg.arg] = set()
        for index, arg in enumerate(arguments):
            if index == 0 and arg.arg == "self" and scope.function.owner is not None:
                continue
            names[arg.arg] = self.annotation_types(arg.annotation, scope.module)
        for child in scope.function.body_nodes:
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    for name in _target_names(target):
                        names.setdefault(name, set())
                if len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
                    names[child.targets[0].id] |= self.expr_types(child.value, scope)
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
                names.setdefault(child.target.id, set())
                names[child.target.id] |= self.annotation_types(child.annotation, scope.module)
            elif isinstance(child, ast.For | ast.AsyncFor | ast.comprehension | ast.With | ast.AsyncWith
                            | ast.NamedExpr | ast.ExceptHandler):
                for name in _bound_names(child):
                    names.setdefault(name, set())
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                names.pop(child.name, None)  # nested defs are resolved as functions, not values
        return names

    # ---- attributes holding callables ----------------------------------------------------------------

    def _is_dispatcher(self, cls: Class, attr: str) -> bool:
        return any(_is_dispatch_table(v) for owner in cls.mro for _, _, v in owner.assignments.get(attr, ()))

    def callable_attr(self, cls: Class, attr: str) -> list[Node | Primitive]:
        """What calling `self.attr(...)` may call, when the attribute holds a callable, not a method."""
        key = (id(cls), attr)
        if key in self._callables:
            return self._callables[key]
        self._callables[key] = []
        found: list[Node | Primitive] = []
        for owner in cls.mro:
            for method, _, value in owner.assignments.get(attr, ()):
                scope = Node(method, cls)
                if value is None:
                    continue
                if _is_dispatch_table(value):
                    for handler in _dispatch_table(value):
                        found.extend(self.callable_targets(handler, scope))
                elif (isinstance(value, ast.Name) and method.node.name == "__init__"
                      and value.id in _parameter_names(method.node)):
                    found.extend(self._constructor_arguments(owner, method.node, value.id))
                else:
                    found.extend(self.callable_targets(value, scope))
        self._callables[key] = _unique(found)
        return self._callables[key]

    def callable_targets(self, value: ast.expr, scope: Node) -> list[Node | Primitive]:
        """What a callable value (not a call) calls when it is called: a function, bound method or lambda."""
        if isinstance(value, ast.Lambda):
            body_scope = scope
            return [t for call in _calls(value.body) for t in self.resolve_call(call, body_scope)[0]]
        if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "partial" and value.args:
            return self.callable_targets(value.args[0], scope)
        if isinstance(value, ast.Name | ast.Attribute):
            return self.resolve_call(ast.Call(func=value, args=[], keywords=[]), scope)[0]
        return []

    def _constructor_arguments(self, cls: Class, init: ast.FunctionDef | ast.AsyncFunctionDef,
                               parameter: str) -> list[Node | Primitive]:
        """The callables passed for `parameter` wherever `cls` is constructed in the modules parsed so far."""
        positional = [a.arg for a in [*init.args.posonlyargs, *init.args.args]][1:]
        found: list[Node | Primitive] = []
        for module in list(self.index.modules):
            for function, call in module.calls_by_name.get(cls.node.name, ()):
                if self.index.resolve_expr_name(call.func, module) is not cls:
                    continue
                scope = Node(function, function.owner)
                for keyword in call.keywords:
                    if keyword.arg == parameter:
                        found.extend(self.callable_targets(keyword.value, scope))
                if parameter in positional and positional.index(parameter) < len(call.args):
                    found.extend(self.callable_targets(call.args[positional.index(parameter)], scope))
        return found


# ---- syntax helpers --------------------------------------------------------------------------------------

def _coordinator_primitive(cls: Class, method: str) -> Primitive | None:
    if cls.qualname == primitives.GROUP_COORDINATOR_CLASS and method in primitives.GROUP_COORDINATOR:
        return Primitive(f"GroupCoordinator.{method}")
    if cls.qualname.startswith(primitives.DISTRIBUTED_PACKAGE) and method in primitives.COMMUNICATOR_METHODS:
        return Primitive(f"{cls.node.name}.{method}")
    return None


_CONTAINER_METHODS = frozenset(
    name for kind in (list, dict, set, str, bytes, tuple, frozenset, int, float) for name in dir(kind))


def _builtin_method(name: str) -> bool:
    """A method every list, dict, set or str has: not counted as a call the scan failed to resolve."""
    return name in _CONTAINER_METHODS


def _calls(expr: ast.expr) -> Iterator[ast.Call]:
    """The calls in a lambda's body."""
    for child in ast.walk(expr):
        if isinstance(child, ast.Call):
            yield child


def _is_dispatch_table(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func).endswith("TypeBasedDispatcher")


def _dispatch_table(call: ast.Call) -> list[ast.expr]:
    if not call.args or not isinstance(call.args[0], ast.List | ast.Tuple):
        return []
    return [pair.elts[1] for pair in call.args[0].elts if isinstance(pair, ast.Tuple) and len(pair.elts) == 2]


def _parameter_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _bound_names(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        yield from _target_names(node.target)
    elif isinstance(node, ast.With | ast.AsyncWith):
        for item in node.items:
            if item.optional_vars is not None:
                yield from _target_names(item.optional_vars)
    elif isinstance(node, ast.NamedExpr):
        yield from _target_names(node.target)
    elif isinstance(node, ast.ExceptHandler) and node.name:
        yield node.name


def _unique(items: list[Node | Primitive]) -> list[Node | Primitive]:
    seen: list[Node | Primitive] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_CONDITION else text[:_MAX_CONDITION - 3] + "..."


# ---- conditions --------------------------------------------------------------------------------------------

def _parents(function: ast.AST) -> dict[int, tuple[ast.AST, str]]:
    """id(child) -> (parent, the parent's field holding it), within one function."""
    parents: dict[int, tuple[ast.AST, str]] = {}
    stack = [function]
    while stack:
        node = stack.pop()
        for name, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    parents[id(child)] = (node, name)
                    if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                        stack.append(child)
    return parents


_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], _EXITS)


def _conditions(call: ast.Call, parents: dict[int, tuple[ast.AST, str]]) -> tuple[str, ...]:
    """The tests that decide whether `call` runs, outermost first, as source text: enclosing if/while/for and
    try, `and`/`or` and conditional-expression operands before it, and earlier `if ...: return` (or
    continue/break/raise) guards of the blocks it sits in."""
    found: list[str] = []
    node: ast.AST = call
    while id(node) in parents:
        parent, name = parents[id(node)]
        inner: list[str] = []
        if isinstance(parent, ast.If | ast.While | ast.IfExp) and name in ("body", "orelse"):
            test = ast.unparse(parent.test)
            keyword = "while" if isinstance(parent, ast.While) else "if"
            inner.append(f"{keyword} {test}" if name == "body" else f"not ({test})")
        elif isinstance(parent, ast.For | ast.AsyncFor) and name == "body":
            inner.append(f"for {ast.unparse(parent.target)} in {ast.unparse(parent.iter)}")
        elif isinstance(parent, ast.Try | ast.TryStar) and name == "body":
            caught = ", ".join(ast.unparse(h.type) if h.type else "everything" for h in parent.handlers)
            inner.append(f"try (an exception before it skips it; caught: {caught or 'nothing'})")
        elif isinstance(parent, ast.ExceptHandler):
            inner.append(f"except {ast.unparse(parent.type) if parent.type else 'everything'}")
        elif isinstance(parent, ast.BoolOp):
            position = next(i for i, v in enumerate(parent.values) if v is node)
            for value in parent.values[:position]:
                text = ast.unparse(value)
                inner.append(text if isinstance(parent.op, ast.And) else f"not ({text})")
        elif isinstance(parent, ast.comprehension) or (
                isinstance(parent, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp)
                and name in ("elt", "key", "value")):
            generators = parent.generators if not isinstance(parent, ast.comprehension) else []
            for generator in generators:
                inner.append(f"for {ast.unparse(generator.target)} in {ast.unparse(generator.iter)}")
                inner.extend(f"if {ast.unparse(test)}" for test in generator.ifs)
        body = getattr(parent, name, None)
        guards: list[str] = []
        if isinstance(body, list) and node in body:
            for earlier in body[:body.index(node)]:
                if isinstance(earlier, ast.If):
                    if _exits(earlier.body):
                        guards.append(f"not ({ast.unparse(earlier.test)}) [earlier guard]")
                    elif _exits(earlier.orelse):
                        guards.append(f"{ast.unparse(earlier.test)} [earlier guard]")
        found[:0] = inner + guards
        node = parent
    return tuple(_short(c) for c in found)
