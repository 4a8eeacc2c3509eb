"""SGLang's source, parsed on demand and looked up by dotted name.

The call graph (graph.py) asks this index what a name in a function's body stands for: a module, a class, a
function or something outside SGLang. Modules are parsed only when a lookup reaches them, so a scan of the PD
loops reads the few hundred modules they reach, not all of srt/.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path


@dataclass(eq=False)
class Function:
    """A function or method; `qualname` is dotted like the audit's names (module.Class.method)."""

    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    module: Module
    owner: Class | None  # the class whose body defines it
    outer: Function | None = None  # the function a nested def sits in

    @cached_property
    def nested(self) -> dict[str, Function]:
        found: dict[str, Function] = {}
        for node in self.body_nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[node.name] = Function(f"{self.qualname}.{node.name}", node, self.module, self.owner, self)
        return found

    def __repr__(self) -> str:
        return f"Function({self.qualname})"

    @cached_property
    def body_nodes(self) -> list[ast.AST]:
        """Its own body's nodes, nested defs excluded, walked once."""
        return _walk_scope(self.node)

    @cached_property
    def calls(self) -> list[ast.Call]:
        return [n for n in self.body_nodes if isinstance(n, ast.Call)]


@dataclass(eq=False)
class Class:
    qualname: str
    node: ast.ClassDef
    module: Module

    @cached_property
    def methods(self) -> dict[str, Function]:
        return {n.name: Function(f"{self.qualname}.{n.name}", n, self.module, self) for n in self.node.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    @cached_property
    def assignments(self) -> dict[str, list[tuple[Function, ast.expr | None, ast.expr | None]]]:
        """attr -> (method, annotation, value) of each `self.attr = value` / `self.attr: T = value` in this
        class's own methods, and (None-valued) its class-level annotations, collected once per class."""
        found: dict[str, list[tuple[Function, ast.expr | None, ast.expr | None]]] = {}
        for method in self.methods.values():
            for child in method.body_nodes:
                if isinstance(child, ast.Assign):
                    pairs = [(t, None) for t in child.targets]
                elif isinstance(child, ast.AnnAssign):
                    pairs = [(child.target, child.annotation)]
                else:
                    continue
                for target, annotation in pairs:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        found.setdefault(target.attr, []).append((method, annotation, child.value))
        return found

    @cached_property
    def annotations(self) -> dict[str, ast.expr]:
        return {n.target.id: n.annotation for n in self.node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}

    @cached_property
    def _base_symbols(self) -> list[Symbol | None]:
        return [self.module.index.resolve_expr_name(base, self.module) for base in self.node.bases]

    @cached_property
    def bases(self) -> list[Class]:
        return [symbol for symbol in self._base_symbols if isinstance(symbol, Class)]

    @cached_property
    def external_bases(self) -> list[str]:
        """Bases from outside SGLang, dotted (`torch.nn.Module`): how a torch module is recognised."""
        return [symbol for symbol in self._base_symbols if isinstance(symbol, str)]

    @cached_property
    def mro(self) -> list[Class]:
        # Left-to-right depth-first with duplicates dropped: close enough to C3 for mixins that do not diamond.
        order: list[Class] = []
        stack: list[Class] = [self]
        while stack:
            cls = stack.pop(0)
            if cls not in order:
                order.append(cls)
                stack = cls.bases + stack
        return order

    def __repr__(self) -> str:
        return f"Class({self.qualname})"

    def lookup(self, name: str, after: Class | None = None) -> Function | None:
        mro = self.mro
        if after is not None and after in mro:
            mro = mro[mro.index(after) + 1:]
        for cls in mro:
            if name in cls.methods:
                return cls.methods[name]
        return None


@dataclass(eq=False)
class Module:
    name: str
    path: Path
    tree: ast.Module
    index: Index
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted name it stands for
    star_imports: list[str] = field(default_factory=list)
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, Class] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)  # module-level `name = other` assignments
    variables: dict[str, ast.expr] = field(default_factory=dict)  # other module-level assignments
    annotations: dict[str, ast.expr] = field(default_factory=dict)  # module-level `name: T [= value]`

    @cached_property
    def calls_by_name(self) -> dict[str, list[tuple[Function, ast.Call]]]:
        """Last name segment of the called expression -> (function, call), over the module's functions."""
        found: dict[str, list[tuple[Function, ast.Call]]] = {}
        for function in _module_functions(self):
            for call in function.calls:
                if isinstance(call.func, ast.Name | ast.Attribute):
                    name = call.func.id if isinstance(call.func, ast.Name) else call.func.attr
                    found.setdefault(name, []).append((function, call))
        return found

    def __repr__(self) -> str:
        return f"Module({self.name})"

    def __post_init__(self) -> None:
        package = self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]
        # Imports anywhere in the module count (SGLang imports lazily inside functions); a name bound
        # differently in two functions would be mis-resolved, which has not been seen in srt/.
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        self.imports.setdefault(head, head)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    if alias.name == "*":
                        self.star_imports.append(base)
                    else:
                        self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[node.name] = Function(f"{self.name}.{node.name}", node, self, None)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = Class(f"{self.name}.{node.name}", node, self)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, ast.Name | ast.Attribute):
                    self.aliases[node.targets[0].id] = node.value
                else:
                    self.variables[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.annotations[node.target.id] = node.annotation
                if node.value is not None:
                    self.variables[node.target.id] = node.value


_CLASS_LINE = re.compile(r"^class\s+(\w+)\s*\(([^)]*)\)", re.M)
_CALLED = re.compile(r"(\w+)\(")
_ACCESSOR_RETURN = re.compile(r"^\s+return\s+[\w.]+\([^()]*\)\.(\w+)\s*$", re.M)


def _module_functions(module: Module) -> list[Function]:
    return [*module.functions.values(), *(m for c in module.classes.values() for m in c.methods.values())]


Symbol = Module | Class | Function | str  # a str is a dotted name outside SGLang (torch.distributed.all_reduce)


def _walk_scope(node: ast.AST) -> list[ast.AST]:
    """The nodes of a function's own body: nested defs are listed but not entered (they are their own scope)."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        found.append(child)
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(child))
    return found


class Index:
    """Modules of one `sglang` package tree (the installed one, or a copy a test edited)."""

    def __init__(self, package_root: Path) -> None:
        self.package_root = package_root
        self._modules: dict[str, Module | None] = {}
        self._class_lines: dict[Path, list[tuple[str, str, str]]] = {}
        self._subclasses: dict[int, list[Class]] = {}
        self._texts: dict[Path, str] | None = None
        self._word_indexes: dict[re.Pattern[str], dict[str, list[Path]]] = {}  # pattern -> match -> files

    def subclasses(self, cls: Class) -> list[Class]:
        """Every class below `cls`, looked for in the files of the package folder its module sits in (and the
        folders under it): a back-end chosen at run time (a radix cache, a KV receiver) is one of these.
        Files are read with a regex and only those that declare a class naming `cls` among its bases are
        parsed, so the cost stays with the folders the scan reaches."""
        if id(cls) in self._subclasses:
            return self._subclasses[id(cls)]
        self._subclasses[id(cls)] = []
        found: list[Class] = []
        for module_name, name, bases in self._class_declarations(cls.module.path.parent):
            if re.search(rf"\b{re.escape(cls.node.name)}\b", bases) is None:
                continue
            module = self.module(module_name)
            sub = module.classes.get(name) if module is not None else None
            if sub is not None and sub is not cls and cls in sub.mro:
                found.append(sub)
                found.extend(c for c in self.subclasses(sub) if c not in found)
        self._subclasses[id(cls)] = found
        return found

    def _class_declarations(self, folder: Path) -> list[tuple[str, str, str]]:
        """(module, class name, bases text) of each top-level class declared under `folder`."""
        found: list[tuple[str, str, str]] = []
        for path in sorted(folder.rglob("*.py")):
            if path not in self._class_lines:
                self._class_lines[path] = [(self._module_name(path), m[1], m[2]) for m in _CLASS_LINE.finditer(
                    path.read_text(errors="replace"))]
            found.extend(self._class_lines[path])
        return found

    def _sources(self) -> dict[Path, str]:
        if self._texts is None:
            self._texts = {path: path.read_text(errors="replace")
                           for path in sorted((self.package_root / "srt").rglob("*.py"))}
        return self._texts

    def _module_name(self, path: Path) -> str:
        parts = ["sglang", *path.relative_to(self.package_root).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _module_of(self, path: Path) -> Module | None:
        return self.module(self._module_name(path))

    def _modules_by(self, pattern: re.Pattern[str], word: str) -> list[Module]:
        """The modules under srt/ where `pattern`'s group matches `word`, from one pass per pattern over every
        file: a search that does not depend on which modules the scan happened to parse first."""
        if pattern not in self._word_indexes:
            found: dict[str, list[Path]] = {}
            for path, text in self._sources().items():
                for match in set(pattern.findall(text)):
                    found.setdefault(match, []).append(path)
            self._word_indexes[pattern] = found
        return [m for path in self._word_indexes[pattern].get(word, ()) if (m := self._module_of(path)) is not None]

    def modules_calling(self, name: str) -> list[Module]:
        """Every module under srt/ whose source calls `name(` (graph.py's construction sites), parsed."""
        return self._modules_by(_CALLED, name)

    def accessor_modules(self, attr: str) -> list[Module]:
        """Every module under srt/ with a line `return f().attr`: where an accessor returns an attribute read off
        another accessor's result (`return get_parallel().tp_group`)."""
        return self._modules_by(_ACCESSOR_RETURN, attr)

    def modules_matching(self, pattern: re.Pattern[str]) -> list[Module]:
        """Every module under srt/ whose source matches `pattern`, parsed."""
        return [m for path, text in self._sources().items() if pattern.search(text)
                and (m := self._module_of(path)) is not None]

    @property
    def modules(self) -> list[Module]:
        return [m for m in self._modules.values() if m is not None]

    def module(self, name: str) -> Module | None:
        if name in self._modules:
            return self._modules[name]
        found = None
        if name == "sglang" or name.startswith("sglang."):
            relative = Path(*name.split(".")[1:])
            for path in (self.package_root / relative.with_suffix(".py"), self.package_root / relative / "__init__.py"):
                if path.is_file():
                    with warnings.catch_warnings():  # SGLang's invalid escapes in docstrings are not ours to report
                        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
                        tree = ast.parse(path.read_text(), str(path))
                    found = Module(name, path, tree, self)
                    break
        self._modules[name] = found
        return found

    def resolve(self, dotted: str, depth: int = 0) -> Symbol | None:
        """What a fully dotted name stands for; names outside SGLang come back as the dotted string."""
        parts = dotted.split(".")
        if parts[0] != "sglang":
            return dotted
        for cut in range(len(parts), 0, -1):
            module = self.module(".".join(parts[:cut]))
            if module is not None:
                return self._in_module(module, parts[cut:], depth)
        return None

    def _in_module(self, module: Module, rest: list[str], depth: int) -> Symbol | None:
        if not rest:
            return module
        if depth > 20:  # re-export cycles
            return None
        name, tail = rest[0], rest[1:]
        if name in module.functions:
            return module.functions[name] if not tail else None
        if name in module.classes:
            cls = module.classes[name]
            return cls if not tail else (cls.lookup(tail[0]) if len(tail) == 1 else None)
        if name in module.imports:
            return self.resolve(".".join([module.imports[name], *tail]), depth + 1)
        if name in module.aliases:
            target = self.resolve_expr_name(module.aliases[name], module, depth + 1)
            if isinstance(target, Module):
                return self._in_module(target, tail, depth + 1)
            return target if not tail else None
        submodule = self.module(f"{module.name}.{name}")
        if submodule is not None:
            return self._in_module(submodule, tail, depth + 1)
        for star in module.star_imports:
            star_module = self.module(star)
            if star_module is not None:
                found = self._in_module(star_module, rest, depth + 1)
                if found is not None:
                    return found
        return None

    def _variable(self, module: Module, parts: list[str]) -> Symbol | None:
        """A module-level variable: outside SGLang when its value is built by something outside SGLang (a
        logger), else not resolved (its class is not inferred)."""
        value = module.variables[parts[0]]
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute):
            built = self.resolve_expr_name(value.func, module)
            if isinstance(built, str):
                return ".".join([f"{module.name}.{parts[0]}", *parts[1:]])
        return None

    def resolve_expr_name(self, expr: ast.expr, module: Module, depth: int = 0) -> Symbol | None:
        """A Name or dotted Attribute chain read at a module's top level (bases, annotations, aliases)."""
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        parts.append(expr.id)
        parts.reverse()
        head, tail = parts[0], parts[1:]
        if head in module.functions or head in module.classes or head in module.aliases:
            return self._in_module(module, parts, depth)
        if head in module.variables:
            return self._variable(module, parts)
        if head in module.imports:
            return self.resolve(".".join([module.imports[head], *tail]), depth + 1)
        for star in module.star_imports:
            star_module = self.module(star)
            if star_module is not None and (found := self._in_module(star_module, parts, depth + 1)) is not None:
                return found
        return None
