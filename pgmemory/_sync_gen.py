"""Writes :mod:`pgmemory.sync_generated`: a blocking method for each coroutine method of a class.

Run ``python -m pgmemory._sync_gen`` after changing a public coroutine method or property of a
class in :data:`TARGETS` (``--check`` only reports whether the file is out of date). The test
suite fails, naming this command, while the committed file differs from what it would write.

For each target, the generator reads the async class's source with :mod:`ast` (so signatures,
annotations and defaults are copied as written, ``from __future__ import annotations`` strings
included) and writes a class ``<sync_name>Methods`` holding, in source order:

- one typed property per public property of the async class, reading it;
- one ``def`` per public coroutine method, with the same signature and a body of one line,
  ``return self._portal.run(self.<attribute>.<name>(...))``: the async method is the only
  implementation.

The hand-written class in :mod:`pgmemory.sync` inherits it and adds the life cycle (the event
loop thread, ``open``/``close``, context manager). The imports the copied annotations and defaults
need are taken from the async class's module (annotation-only ones under ``TYPE_CHECKING``).
A public method that is neither a coroutine nor a property must be listed in ``hand_written``.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import importlib
import inspect
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = Path(__file__).resolve().parent / "sync_generated.py"
COMMAND = "python -m pgmemory._sync_gen"


@dataclass(frozen=True)
class Target:
    """An async class to give blocking methods.

    Attributes:
        module: The module defining the class (``"pgmemory.store.store"``).
        class_name: The async class (``"MemoryStore"``).
        sync_name: The hand-written sync class; the generated one is ``<sync_name>Methods``.
        attribute: The sync object's attribute holding the async object.
        hand_written: Public methods the sync class writes itself (life cycle, non-coroutines).
    """

    module: str
    class_name: str
    sync_name: str
    attribute: str = "async_store"
    hand_written: Sequence[str] = ()


#: The classes written to :data:`OUTPUT`, in this order. Add one line per async class.
TARGETS: tuple[Target, ...] = (
    Target(
        "pgmemory.store.store",
        "MemoryStore",
        "SyncMemoryStore",
        hand_written=("open", "close", "shared_transaction"),
    ),
    Target("pgmemory.admin.admin", "Admin", "SyncAdmin", attribute="async_admin"),
)


@dataclass
class Generated:
    """One generated class and the imports its text needs."""

    source: str
    #: Name -> the import statement binding it, for names read at run time (in defaults).
    runtime_imports: dict[str, str] = field(default_factory=dict)
    #: Name -> import statement, for names read by annotations only (under ``TYPE_CHECKING``).
    typing_imports: dict[str, str] = field(default_factory=dict)


def _bindings(tree: ast.Module, module: str) -> dict[str, str]:
    """Each top-level name of ``module`` mapped to the import statement binding it elsewhere:
    its own imports (also those under ``if TYPE_CHECKING:``) and its own definitions."""
    found: dict[str, str] = {}
    package = module.rpartition(".")[0]

    def visit(statements: Iterable[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        found[alias.asname] = f"import {alias.name} as {alias.asname}"
                    else:
                        top = alias.name.split(".")[0]
                        found[top] = f"import {top}"
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                source = node.module or ""
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    source = f"{base}.{source}" if source else base
                for alias in node.names:
                    name = alias.asname or alias.name
                    found[name] = f"from {source} import {alias.name}" + (
                        f" as {alias.asname}" if alias.asname else ""
                    )
            elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                found[node.name] = f"from {module} import {node.name}"
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = f"from {module} import {target.id}"

    visit(tree.body)
    return found


def _names(expression: ast.expr, *, annotation: bool = True) -> set[str]:
    """The names an expression reads; in an annotation, those of quoted parts (``"Foo"``) too."""
    names: set[str] = set()
    for node in ast.walk(expression):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif annotation and isinstance(node, ast.Constant) and isinstance(node.value, str):
            with contextlib.suppress(SyntaxError):  # a string that is not an expression
                names |= _names(ast.parse(node.value, mode="eval").body)
    return names


def _summary(node: ast.AsyncFunctionDef | ast.FunctionDef) -> str:
    """The first paragraph of a docstring, on one line ('' if there is none)."""
    doc = ast.get_docstring(node) or ""
    paragraph = doc.split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    return "" if '"""' in text or "\\" in text else text


def _docstring(first: str, summary: str) -> str:
    """A docstring statement, indented for a method body, wrapped to the line length."""
    word = summary.split(" ", 1)[0]
    if word[:1].isupper() and not any(c.isupper() for c in word[1:]) and word != "I":
        summary = summary[0].lower() + summary[1:]  # "...: a page of ...", not "...: A page"
    text = f"{first}: {summary}" if summary else f"{first}."
    lines = textwrap.wrap(f'"""{text}"""', width=100 - 8)
    return textwrap.indent("\n".join(lines), " " * 8).lstrip() if lines else '""""""'


def _signature(
    source: str, node: ast.AsyncFunctionDef, class_name: str
) -> tuple[str, str, set[str], set[str]]:
    """A method's parameters as written, the call passing them on (``self`` left out), and the
    names its annotations and its defaults read."""
    args = node.args
    params: list[str] = []
    call: list[str] = []
    annotation_names: set[str] = set()
    default_names: set[str] = set()

    def text(expression: ast.expr) -> str:
        segment = ast.get_source_segment(source, expression)
        assert segment is not None
        return segment

    positional = [*args.posonlyargs, *args.args]

    def param(arg: ast.arg, default: ast.expr | None, prefix: str = "") -> str:
        piece = prefix + arg.arg
        if arg.annotation is not None:
            annotation_names.update(_names(arg.annotation))
            piece += f": {text(arg.annotation)}"
        elif arg is not positional[0]:  # self
            raise TypeError(f"{class_name}.{node.name}: parameter {arg.arg} has no annotation")
        if default is not None:
            default_names.update(_names(default, annotation=False))
            piece += f" = {text(default)}" if arg.annotation else f"={text(default)}"
        return piece

    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        params.append(param(arg, default))
        if i:
            call.append(arg.arg)
        if args.posonlyargs and arg is args.posonlyargs[-1]:
            params.append("/")
    if args.vararg:
        params.append(param(args.vararg, None, "*"))
        call.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        params.append("*")
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(param(arg, kw_default))
        call.append(f"{arg.arg}={arg.arg}")
    if args.kwarg:
        params.append(param(args.kwarg, None, "**"))
        call.append(f"**{args.kwarg.arg}")
    return ", ".join(params), ", ".join(call), annotation_names, default_names


def generate(
    module: str,
    class_name: str,
    sync_name: str,
    *,
    attribute: str = "async_store",
    hand_written: Iterable[str] = (),
) -> Generated:
    """The blocking methods and properties of ``module.class_name`` as class
    ``<sync_name>Methods`` (unformatted source), with the imports they need.

    Raises:
        TypeError: The class has a base class (only its own body is read), a public method
            that is neither a coroutine nor a property nor listed in ``hand_written``, a
            settable property, or a method without annotations.
    """
    cls = getattr(importlib.import_module(module), class_name)
    if cls.__bases__ != (object,):
        raise TypeError(f"{class_name} has base classes; only a class's own body is read")
    path = inspect.getsourcefile(cls)
    assert path is not None, class_name
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    bindings = _bindings(tree, module)
    (class_node,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    skip = set(hand_written)
    out = Generated(source="")
    typing_names: set[str] = {class_name}
    runtime_names: set[str] = set()

    def text(node: ast.expr) -> str:
        segment = ast.get_source_segment(source, node)
        assert segment is not None
        return segment

    properties: list[str] = []
    methods: list[str] = []
    for node in class_node.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        name = node.name
        if name.startswith("_") or name in skip:
            continue
        member = inspect.getattr_static(cls, name)
        if node.returns is None:
            raise TypeError(f"{class_name}.{name} has no return annotation")
        if isinstance(member, property):
            if member.fset is not None or member.fdel is not None:
                raise TypeError(f"{class_name}.{name} is a settable property: write it by hand")
            typing_names |= _names(node.returns)
            properties.append(
                f"    @property\n"
                f"    def {name}(self) -> {text(node.returns)}:\n"
                f"        {_docstring(f':attr:`{class_name}.{name}`', _summary(node))}\n"
                f"        return self.{attribute}.{name}\n"
            )
            continue
        if not isinstance(node, ast.AsyncFunctionDef) or not inspect.iscoroutinefunction(member):
            raise TypeError(
                f"{class_name}.{name} is neither a coroutine method nor a property: write its "
                f"sync form in {sync_name} and list it in the target's hand_written"
            )
        params, call, annotation_names, default_names = _signature(source, node, class_name)
        typing_names |= annotation_names
        runtime_names |= default_names
        typing_names |= _names(node.returns)
        methods.append(
            f"    def {name}({params}) -> {text(node.returns)}:\n"
            f"        {_docstring(f'Blocking :meth:`{class_name}.{name}`', _summary(node))}\n"
            f"        return self._portal.run(self.{attribute}.{name}({call}))\n"
        )

    def imports(names: set[str]) -> dict[str, str]:
        found = {}
        for name in names:
            if name in bindings:
                found[name] = bindings[name]
            elif not hasattr(builtins, name):
                raise TypeError(f"{class_name}: cannot tell where {name!r} comes from")
        return found

    out.runtime_imports = imports(runtime_names)
    out.typing_imports = {
        name: statement
        for name, statement in imports(typing_names).items()
        if name not in out.runtime_imports
    }
    out.source = (
        f"class {sync_name}Methods:\n"
        f'    """The blocking methods of :class:`~pgmemory.sync.{sync_name}`, one per coroutine\n'
        f'    method of :class:`~{module}.{class_name}` (which does the work)."""\n\n'
        f"    _portal: Portal\n"
        f"    {attribute}: {class_name}\n\n" + "\n".join(properties + methods)
    )
    return out


HEADER = f'''\
"""Blocking methods over async classes, generated by ``{COMMAND}``: do not edit.

Each method here runs the async class's own method on the sync object's event loop; the classes
using them, and their life cycle, are written by hand in :mod:`pgmemory.sync`.
"""

# GENERATED FILE: edit the async classes, then run `{COMMAND}`.

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, TypeVar

{{runtime}}

if TYPE_CHECKING:
{{typing}}

T = TypeVar("T")


class Portal(Protocol):
    """Runs an awaitable on the sync object's event loop and blocks until its result."""

    def run(self, awaitable: Awaitable[T], /) -> T: ...

'''


#: The names :data:`HEADER` binds (the generated ones as their own statements).
_HEADER_NAMES = {
    "annotations": "from __future__ import annotations",
    "Awaitable": "from collections.abc import Awaitable",
    "TYPE_CHECKING": "from typing import TYPE_CHECKING",
    "Protocol": "from typing import Protocol",
    "TypeVar": "from typing import TypeVar",
    "T": "T = TypeVar('T')",
    "Portal": "class Portal",
}


def _ruff(args: list[str], code: str) -> str:
    """``code`` passed through ``ruff <args>`` (with the project's configuration)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(OUTPUT), "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff {' '.join(args)} failed:\n{done.stderr}{done.stdout}")
    return done.stdout


def render(targets: Sequence[Target] = TARGETS) -> str:
    """The text of :data:`OUTPUT` for ``targets``: imports sorted and formatted by ruff."""
    classes = [
        generate(
            t.module, t.class_name, t.sync_name, attribute=t.attribute, hand_written=t.hand_written
        )
        for t in targets
    ]
    # The names the header binds, then every class's: one name, one meaning.
    bound = dict(_HEADER_NAMES)
    for name, statement in (
        item for c in classes for item in (*c.runtime_imports.items(), *c.typing_imports.items())
    ):
        if bound.setdefault(name, statement) != statement:
            raise TypeError(f"{name!r} means both {bound[name]!r} and {statement!r}")
    runtime = {s for c in classes for s in c.runtime_imports.values()}
    typing = {s for c in classes for s in c.typing_imports.values()} - runtime
    runtime -= set(_HEADER_NAMES.values())
    typing -= set(_HEADER_NAMES.values())
    code = HEADER.format(
        runtime="\n".join(sorted(runtime)),
        typing="\n".join(f"    {line}" for line in sorted(typing)) or "    pass",
    )
    code += "\n\n".join(c.source for c in classes)
    code += f"\n\n__all__ = {sorted(['Portal', *(t.sync_name + 'Methods' for t in targets)])!r}\n"
    code = _ruff(["check", "--select", "I", "--fix", "--quiet", "--exit-zero"], code)
    return _ruff(["format", "--quiet"], code)


def main(argv: Sequence[str] | None = None) -> int:
    """Write :data:`OUTPUT` (or, with ``--check``, say whether it is up to date)."""
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=f"Write {OUTPUT.name} from the async classes."
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    options = parser.parse_args(argv)
    text = render()
    current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
    if options.check:
        if text != current:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if text != current:
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
