"""The type stubs shipped in the package (sparsemla/*.pyi, py.typed) against the runtime modules:
every public name is declared, nothing is declared that does not exist, and every function's
parameters (names, kinds, defaults) are the runtime's. The _C stub is nanobind's stubgen output;
where the pinned nanobind is installed it is regenerated and compared."""

import ast
import inspect
import os
import pathlib
import subprocess
import sys
import types

import pytest

import sparsemla
from sparsemla import _C, _ops, flashmla, testing

PKG = pathlib.Path(sparsemla.__file__).parent
# The nanobind whose stubgen wrote _C.pyi (python/requirements.txt and pyproject pin the same).
STUBGEN_NANOBIND = "3.1.0"


def stub(name):
    path = PKG / f"{name}.pyi"
    assert path.is_file(), f"{path} is not installed"
    return ast.parse(path.read_text())


def declared(tree):
    """Top-level names a stub exports: definitions, annotated or assigned names and `import x as x`
    re-exports (a plain import is private in a stub); _-names except dunders are private."""
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update((a.asname, node) for a in node.names if a.asname == a.name)
    return {n: v for n, v in names.items()
            if not n.startswith("_") or (n.startswith("__") and n != "__all__")}


def runtime_public(mod):
    if hasattr(mod, "__all__"):
        return set(mod.__all__)
    return {n for n in dir(mod) if not n.startswith("_")
            and not isinstance(getattr(mod, n), types.ModuleType)}


def stub_all(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


MODULES = [("__init__", sparsemla), ("flashmla", flashmla), ("testing", testing)]


def test_py_typed_is_installed():
    assert (PKG / "py.typed").is_file()


@pytest.mark.parametrize("name,mod", MODULES, ids=[m.__name__ for _, m in MODULES])
def test_stub_names_are_the_public_names(name, mod):
    tree = stub(name)
    names = set(declared(tree))
    assert names == runtime_public(mod), "stub and module differ: " \
        f"missing {sorted(runtime_public(mod) - names)}, extra {sorted(names - runtime_public(mod))}"
    assert stub_all(tree) == getattr(mod, "__all__", None)


def stub_params(fn):
    """[(name, kind, default)] of a stub FunctionDef; default None when the parameter has none."""
    a, out = fn.args, []
    pos = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(pos) - len(a.defaults)) + \
        [ast.literal_eval(d) for d in a.defaults]
    out += [(p.arg, inspect.Parameter.POSITIONAL_ONLY, d)
            for p, d in zip(a.posonlyargs, defaults)]
    out += [(p.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, d)
            for p, d in zip(a.args, defaults[len(a.posonlyargs):])]
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    out += [(p.arg, inspect.Parameter.KEYWORD_ONLY,
             inspect.Parameter.empty if d is None else ast.literal_eval(d))
            for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return out


def runtime_params(obj):
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


# Runtime **kwargs that the stub spells out: the keywords the call accepts, with their defaults.
SPELLED_KWARGS = {"sparse_decode": _ops._DECODE_KW}


def functions():
    for name, mod in MODULES:
        for fname, node in declared(stub(name)).items():
            if isinstance(node, ast.FunctionDef):
                yield pytest.param(mod, node, id=f"{mod.__name__}.{fname}")


@pytest.mark.parametrize("mod,node", list(functions()))
def test_stub_signatures_match(mod, node):
    want, got = runtime_params(getattr(mod, node.name)), stub_params(node)
    if node.name in SPELLED_KWARGS:
        assert want[-1][1] == inspect.Parameter.VAR_KEYWORD
        kw = SPELLED_KWARGS[node.name]
        want = want[:-1] + [(k, inspect.Parameter.KEYWORD_ONLY, d) for k, d in kw.items()]
        got = got[:len(want) - len(kw)] + sorted(got[len(want) - len(kw):])
        want = want[:len(want) - len(kw)] + sorted(want[len(want) - len(kw):])
    assert got == want


def class_attrs(tree, cls):
    node = declared(tree)[cls]
    return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}


def test_decode_plan_stub_covers_the_plan():
    plan = sparsemla.plan_decode(2, 16, 128)
    public = {n for n in dir(_C.DecodePlan) if not n.startswith("_")} | {"packed"}
    assert class_attrs(stub("__init__"), "DecodePlan") == public
    for n in public:
        getattr(plan, n)


def test_sched_meta_stub_covers_its_fields():
    assert class_attrs(stub("flashmla"), "FlashMLASchedMeta") == set(
        vars(flashmla.FlashMLASchedMeta()))


def test_extension_stub_names():
    names = set(declared(stub("_C"))) - {"__version__"}
    assert names == {n for n in dir(_C) if not n.startswith("_")}


def test_extension_stub_is_stubgen_output(tmp_path):
    nanobind = pytest.importorskip("nanobind")
    if nanobind.__version__ != STUBGEN_NANOBIND:
        pytest.skip(f"nanobind {nanobind.__version__}, the stub was made by {STUBGEN_NANOBIND}")
    out = tmp_path / "_C.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "sparsemla._C", "-o",
                    str(out)], check=True, env=dict(os.environ, SPARSEMLA_NO_TORCH="1"))
    assert out.read_text() == (PKG / "_C.pyi").read_text(), \
        "python/sparsemla/_C.pyi is stale: regenerate it (scripts/gen-stubs)"
