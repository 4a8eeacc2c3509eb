"""The ways a request reaches the ranks from outside their loop: SGLang's HTTP routes and its native gRPC server.

A request from either goes to the scheduler, whose loop broadcasts it and dispatches it by type (the
`TypeBasedDispatcher` table graph.py reads), so what a door can reach is what its handler reaches. A door is an
HTTP route function of `sglang.srt.entrypoints.http_server` (its decorator names the path and methods) or a method
of `sglang.srt.entrypoints.grpc_bridge.RuntimeHandle`, which SGLang's gRPC server (a Rust extension, started by
`--grpc-port` or `SGLANG_GRPC_PORT`) calls. Its request types are the classes it takes (parameter annotations) or
builds (constructor calls, nested defs included); its handlers are the dispatcher's entries for those types. A
request the tokenizer manager turns into another type (a generate request, tokenized) is not followed: such a door
maps to no handler here.
"""

from __future__ import annotations

import ast

from tests.support.desync_scan.graph import Graph, Node
from tests.support.desync_scan.index import Class, Function, Module

HTTP_SERVER = "sglang.srt.entrypoints.http_server"
GRPC_HANDLE = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle"
DISPATCHER = "_request_dispatcher"
_VERBS = frozenset({"get", "post", "put", "delete", "patch"})


def dispatch_table(graph: Graph, scheduler: Class) -> dict[Class, list[Node]]:
    """Request class -> the handlers the scheduler's dispatcher calls for it."""
    table: dict[Class, list[Node]] = {}
    for owner in scheduler.mro:
        for method, _, value in owner.assignments.get(DISPATCHER, ()):
            if not isinstance(value, ast.Call) or not value.args or not isinstance(value.args[0], ast.List):
                continue
            scope = Node(method, scheduler)
            for pair in value.args[0].elts:
                if not isinstance(pair, ast.Tuple) or len(pair.elts) != 2:
                    continue
                kinds = pair.elts[0].elts if isinstance(pair.elts[0], ast.Tuple) else [pair.elts[0]]
                handlers = [t for t in graph.callable_targets(pair.elts[1], scope) if isinstance(t, Node)]
                for kind in kinds:
                    if isinstance(cls := graph.index.resolve_expr_name(kind, method.module), Class):
                        table.setdefault(cls, []).extend(handlers)
    return table


def _request_classes(graph: Graph, node: ast.AST, module: Module, known: dict[Class, list[Node]]) -> set[Class]:
    found: set[Class] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name | ast.Attribute) and isinstance(child.ctx, ast.Load):
            symbol = graph.index.resolve_expr_name(child, module)
            if isinstance(symbol, Class) and symbol in known:
                found.add(symbol)
    return found


def _route(function: Function) -> str | None:
    """`POST /path` from `@app.post("/path")`, `GET,POST /path` from `@app.api_route(..., methods=[...])`
    (commas, not `|`: the page's table cells split on `|`)."""
    for decorator in function.node.decorator_list:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.args and isinstance(decorator.args[0], ast.Constant)):
            continue
        verb = decorator.func.attr
        if verb in _VERBS:
            return f"{verb.upper()} {decorator.args[0].value}"
        if verb == "api_route":
            methods = next((k.value for k in decorator.keywords if k.arg == "methods"), None)
            names = [e.value for e in methods.elts] if isinstance(methods, ast.List | ast.Tuple) else ["GET"]
            return f"{','.join(sorted(names))} {decorator.args[0].value}"
    return None


def doors(graph: Graph, scheduler: Class) -> dict[str, set[str]]:
    """Door -> the qualified names of the handlers its requests are dispatched to (doors that reach none left out)."""
    table = dispatch_table(graph, scheduler)
    found: dict[str, set[str]] = {}

    def add(name: str, function: Function) -> None:
        handlers = {h.name for cls in _request_classes(graph, function.node, function.module, table)
                    for h in table[cls]}
        if handlers:
            found.setdefault(name, set()).update(handlers)

    if (http := graph.index.module(HTTP_SERVER)) is not None:
        for function in http.functions.values():
            if (route := _route(function)) is not None:
                add(route, function)
    handle = graph.index.resolve(GRPC_HANDLE)
    if isinstance(handle, Class):
        for name, method in handle.methods.items():
            add(f"gRPC {handle.node.name}.{name}", method)
    return found
