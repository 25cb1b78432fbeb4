"""Static scan of a learner's exercise source for code that reaches the check machinery or the runtime.

The sandbox protects the grader, but inside its own kernel a learner can rebind a check or patch IPython so a
failure looks passed. :func:`scan` parses the source after IPython's input transformer (magics and ``!`` lines
included) and flags the modules, attributes and names of the tables below, assignments to a module's attribute,
``/proc`` and dynamic calls with a non-literal argument; literal code given to ``exec``/``eval``/``%time`` is
scanned too. Flagged exercises go to review and run as stubs. Every honest solution scans clean
(``tests/test_grade.py::test_honest_solutions_scan_clean``).

Example::

    scan("import sys\\nsys.modules['course_tools.checks'].expect = print")   # [Flag(line=2, ...)]
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_grader.steps import Submission

__all__ = ["Flag", "scan", "transform", "step"]


def _named(what: str, *names: str) -> dict[str, str]:
    return {name: f"{what}({name})" for name in names}


# module -> reason; importing it (or any attribute of it) is flagged
_MODULES = {"course_tools": "使用评分用的 course_tools(check 函数)", "_thread": "底层线程",
            **dict.fromkeys(("IPython", "ipykernel", "traitlets"), "操作 IPython 内核"),
            **dict.fromkeys(("jupyter_client", "zmq"), "操作 Jupyter 协议"),
            **_named("修改内置函数", "builtins"), **_named("使用信号", "signal"), **_named("动态导入", "importlib"),
            **_named("直接访问内存", "ctypes"), **_named("遍历解释器中的对象", "gc"), **_named("访问调用栈", "inspect"),
            **_named("访问环境变量", "posix", "nt")}
# "module.attribute" -> reason
_MODULE_ATTRS = {"sys.modules": "访问 sys.modules(可替换 check 模块)",
                 **dict.fromkeys(("sys.audit", "sys.addaudithook"), "修改审计钩子"),
                 **dict.fromkeys(("os.putenv", "os.unsetenv"), "修改环境变量"),
                 **_named("修改导入机制", "sys.meta_path", "sys.path_hooks"), **_named("访问调用栈", "sys._getframe"),
                 **_named("跟踪执行", "sys.settrace", "sys.setprofile"), **_named("修改异常处理", "sys.excepthook"),
                 **_named("修改输出处理", "sys.displayhook"), **_named("访问环境变量", "os.environ"),
                 **_named("发送信号", "os.kill", "os.killpg")}
# attribute names flagged on any object
_ATTRS = {"__globals__": "访问函数的全局变量(__globals__)", "__dict__": "直接修改对象字典(__dict__)",
          **_named("修改内置函数", "__builtins__"), **_named("替换函数代码", "__code__"), **_named("访问闭包", "__closure__"),
          **_named("遍历类层次", "__subclasses__"), **_named("访问环境变量", "environ", "environb"),
          **dict.fromkeys(("f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "cr_frame", "tb_frame"),
                          "访问调用栈"),
          **dict.fromkeys(("input_transformers_cleanup", "input_transformers_post"), "修改 IPython 输入转换器"),
          **dict.fromkeys(("set_custom_exc", "showtraceback", "_showtraceback", "CustomTB"), "修改 IPython 异常处理"),
          "ast_transformers": "修改 IPython AST 转换器", "user_ns": "访问 IPython 命名空间", "run_cell": "操作 IPython 内核"}
_NAMES = {"get_ipython": "操作 IPython 内核(get_ipython)", "__builtins__": "修改内置函数(__builtins__)",
          "globals": "修改全局命名空间(globals())", "vars": "读取对象字典(vars())"}
# modules whose attributes are flagged at any depth when assigned
_PATCHED = set(_MODULES) | {"sys", "os"}
_DYNAMIC = {"exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr", "hasattr"}
_TIMING_MAGICS = {"time", "timeit"}


@dataclass(frozen=True)
class Flag:
    """One suspicious line: 1-based ``line`` of the cell, its ``code`` and the Chinese ``reason``."""

    line: int
    code: str
    reason: str

    def __str__(self) -> str:
        return f"第 {self.line} 行 `{self.code}`: {self.reason}"


def transform(source: str) -> str:
    """The Python that IPython would run for ``source`` (magics become ``get_ipython()`` calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - an untransformable cell is scanned as written
        return source


def _literal_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.modules: dict[str, str] = {}  # local alias -> module name
        self.flags: list[tuple[int, str]] = []

    def flag(self, node: ast.AST, reason: str) -> None:
        self.flags.append((getattr(node, "lineno", 1), reason))

    def _module_of(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._module_of(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _check_module(self, name: str, node: ast.AST) -> None:
        parts = name.split(".")   # the root module, then "module.attribute" (every key of that table has a dot)
        for key, table in ((parts[0], _MODULES), (".".join(parts[:2]), _MODULE_ATTRS)):
            if key in table:
                self.flag(node, table[key])

    def _check_attr(self, module: str | None, attr: str, node: ast.AST) -> None:
        if attr in _ATTRS:
            self.flag(node, _ATTRS[attr])
        if module:
            key = f"{module.split('.')[0]}.{attr}"
            if key in _MODULE_ATTRS:
                self.flag(node, _MODULE_ATTRS[key])

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)
            self.modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_module(module, node)
        for alias in node.names:
            self._check_attr(module, alias.name, node)
            self._check_module(f"{module}.{alias.name}", node)
            self.modules[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _NAMES:
            self.flag(node, _NAMES[node.id])
        elif node.id in _DYNAMIC:  # g = getattr; g(obj, name) would hide the call
            self.flag(node, f"把 {node.id} 当作变量使用")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check_attr(self._module_of(node.value), node.attr, node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "/proc" in node.value:
            self.flag(node, "读取 /proc(进程信息)")

    def _assign_target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Attribute):
            module = self._module_of(target.value)
            # module.attr = ... is monkey-patching; torch.backends.cudnn.benchmark = ... is configuration
            if module is not None and (isinstance(target.value, ast.Name) or module.split(".")[0] in _PATCHED):
                self.flag(target, f"修改模块属性 {module}.{target.attr}")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assign_target(element)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assign_target(target)
            imported = self._imported_name(node.value)
            if isinstance(target, ast.Name) and imported:  # sys = __import__("sys")
                self.modules[target.id] = imported
        self.generic_visit(node)

    @staticmethod
    def _imported_name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Call) and node.args and _literal_str(node.args[0]):
            func = node.func
            if (isinstance(func, ast.Name) and func.id == "__import__") or (
                    isinstance(func, ast.Attribute) and func.attr == "import_module"):
                return _literal_str(node.args[0])
        return None

    def visit_Delete(self, node: ast.Delete | ast.AugAssign) -> None:
        for target in getattr(node, "targets", None) or [node.target]:
            self._assign_target(target)
        self.generic_visit(node)

    visit_AugAssign = visit_Delete

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name in _DYNAMIC:
            literal = _literal_str(node.args[0]) if node.args else None
            if name in ("exec", "eval", "compile"):
                if literal is None:
                    self.flag(node, f"{name}() 执行非字面量代码")
                else:
                    self._nested(literal, node)
            elif name == "__import__":
                if literal is None:
                    self.flag(node, "__import__() 的模块名不是字面量")
                else:
                    self._check_module(literal, node)
            else:  # getattr / setattr / delattr / hasattr
                attr = _literal_str(node.args[1]) if len(node.args) > 1 else None
                if attr is None:
                    self.flag(node, f"{name}() 的属性名不是字面量")
                else:
                    self._check_attr(self._module_of(node.args[0]), attr, node)
                    if name in ("setattr", "delattr") and self._module_of(node.args[0]) is not None:
                        self.flag(node, f"修改模块属性 {self._module_of(node.args[0])}.{attr}")
        magic = self._magic(node)
        if magic is None and name in _DYNAMIC:
            for child in [*node.args, *node.keywords]:
                self.visit(child)
        elif magic is None:
            self.generic_visit(node)
        elif magic[0] in _TIMING_MAGICS:  # %time CODE runs CODE: scan it
            for code in magic[1]:
                self._nested(code, node)
        else:
            self.flag(node, f"IPython 魔法命令或 shell 命令({magic[0]})")

    @staticmethod
    def _magic(node: ast.Call) -> tuple[str, list[str]] | None:
        """``get_ipython().run_line_magic('time', 'code')`` -> ('time', ['code']); '!cmd' -> ('system', [])."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name) and func.value.func.id == "get_ipython"):
            return None
        if func.attr in ("run_line_magic", "run_cell_magic") and node.args and _literal_str(node.args[0]):
            return _literal_str(node.args[0]), [s for s in (_literal_str(a) for a in node.args[1:]) if s]
        return func.attr, []

    def _nested(self, code: str, node: ast.AST) -> None:
        try:
            tree = ast.parse(transform(code))
        except (SyntaxError, ValueError):
            self.flag(node, "执行的字符串不是可解析的代码")
            return
        inner = _Scanner()
        inner.modules = dict(self.modules)
        inner.visit(tree)
        line = getattr(node, "lineno", 1)
        self.flags += [(line, reason) for _, reason in inner.flags]


def scan(source: str) -> list[Flag]:
    """Suspicious lines of one exercise cell, in line order (one :class:`Flag` per line, reasons joined)."""
    lines = source.splitlines()
    try:
        tree = ast.parse(transform(source))
    except (SyntaxError, ValueError):  # the kernel cannot run it either: the cell simply fails
        return []
    scanner = _Scanner()
    scanner.visit(tree)
    by_line: dict[int, dict[str, None]] = {}   # each line's reasons, once each, in order
    for line, reason in scanner.flags:
        by_line.setdefault(line, {})[reason] = None
    return [Flag(line, (lines[line - 1].strip() if 0 < line <= len(lines) else "")[:120], ";".join(reasons))
            for line, reasons in sorted(by_line.items())]


def step(sub: Submission) -> None:
    """Exercises the scan flagged go to review and run as stubs (``sub.stubbed``: index -> why) unless --run-flagged."""
    plan, grade = sub.plan, sub.grade
    for index, flags in plan.flags.items():
        text = "; ".join(str(f) for f in flags)
        grade.review.append(f"{plan.label(index)}: {text}")
        if sub.options.run_flagged:
            grade.notes.append(f"需人工检查: {plan.label(index)}: {text}(--run-flagged: 照常运行)")
        else:
            sub.stubbed[index] = f"需人工检查,{plan.label(index)} 未运行,暂按 0 分: {text}"
            grade.notes.append(sub.stubbed[index])
