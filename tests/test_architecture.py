"""The package's shape: imports flow one way, modules stay single-purpose, private APIs stay in their modules."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "kdist"
MAX_LINES = 450


def _modules():
    """Dotted module name -> (path, parsed source) for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        out[name] = (path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()


def _imports(name, tree, path):
    """(imported kdist module, line, inside a function) for each import statement of a module."""
    found = []
    functions = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*parts, base] if base else parts)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            found.append((target, node.lineno, id(node) in functions))
    return found


def _graph():
    edges = {}
    for name, (path, tree) in MODULES.items():
        deps = set()
        for target, _, _ in _imports(name, tree, path):
            if target in MODULES and target != name and target != "kdist" and not name.startswith(target + "."):
                deps.add(target)
        edges[name] = deps
    return edges


def test_no_import_circle():
    edges = _graph()
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == "open":
                circles.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_modules_are_short():
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path, _ in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by subject): {long}"


def test_imports_inside_functions_say_why():
    unexplained = []
    for name, (path, tree) in MODULES.items():
        lines = path.read_text().splitlines()
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for f in functions:
            for node in ast.walk(f):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line, before = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in line and not before.startswith("#"):
                        unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {line.strip()}")
    assert not unexplained, "imports inside functions without a one-line reason:\n" + "\n".join(unexplained)


def test_only_the_cli_imports_the_package_root():
    offenders = []
    for name, (path, tree) in MODULES.items():
        if name == "kdist" or name.startswith("kdist.cli") or name == "kdist.__main__":
            continue
        for target, line, _ in _imports(name, tree, path):
            if target == "kdist":
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    assert not offenders, "modules below the CLI importing the package root: " + ", ".join(offenders)


@pytest.mark.parametrize(
    "module, allowed",
    [
        ("keras.src", {"kdist.keras_internals", "kdist.keras_internals.loading", "kdist.keras_internals.attention"}),
        ("jax._src", {"kdist.jax_internals"}),
    ],
)
def test_private_apis_live_in_one_module(module, allowed):
    users = {
        name
        for name, (path, tree) in MODULES.items()
        for target, _, _ in _imports(name, tree, path)
        if target == module or target.startswith(module + ".")
    }
    assert users <= allowed, f"{module} is used outside {allowed}: {sorted(users - allowed)}"


def test_render_imports_no_analysis_module():
    analysis = ("kdist.inspection", "kdist.linting", "kdist.planning", "kdist.runtime", "kdist.cli")
    offenders = []
    for name, (path, tree) in MODULES.items():
        if name.startswith("kdist.render"):
            offenders += [f"{name} -> {t}" for t, _, _ in _imports(name, tree, path) if t.startswith(analysis)]
    assert not offenders, offenders


def test_no_module_shadows_a_public_function():
    import kdist

    public = {
        name for name in kdist.__all__ if callable(getattr(kdist, name)) and not isinstance(getattr(kdist, name), type)
    }
    shadows = sorted(name.split(".")[1] for name in MODULES if name.count(".") == 1 and name.split(".")[1] in public)
    assert not shadows, f"modules named like public functions of kdist (kdist.X would be ambiguous): {shadows}"
