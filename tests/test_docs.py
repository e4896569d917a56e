"""Every code block of README.md and docs/*.md runs, so no documented example can rot.

Per file, the Python blocks run in order in one fresh interpreter (like a
notebook) on 8 fake CPU devices, in a scratch directory holding a stand-in
user project (`my_project/models.py` with `build_model`, `my_rules.toml`), the
names the docs use for "your model" and "your rules"; a block whose first line
names a file (`# train.py`) is also written there, for the doc's commands. Shell blocks run each
`kdist ...` line through `python -m kdist` there; their exit status must be 0,
or 1 where the command reports a finding (lint errors, no plan), never a
traceback. `pip`, `python -m venv` and the Open MPI / SLURM install lines are the
install steps CI itself runs from a fresh checkout. TOML and JSON blocks must parse;
`text` blocks are outputs and synopses; every block must say which of these it is.
The blocks and commands of a session share one JAX compilation cache (a fresh
one each session), so a program one doc compiled is read back, not compiled
again, by the next: the suite's run time; every command still runs whole.
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib

import pytest

from tests.subprocess_utils import clean_env, compilation_cache_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
LANGUAGES = {"python", "bash", "console", "text", "toml", "json", "yaml"}
INSTALL_STEPS = ("pip ", "python3 -m venv", "python -m venv", ". .venv", "(command -v mpirun")  # CI installs these
PROJECT = {
    "my_project/__init__.py": "",
    "my_project/models.py": '''
        import kdist


        def build_model():
            """Stands in for the user's model in the docs' examples."""
            return kdist.models.tiny_transformer()
    ''',
    "my_rules.toml": """
        name = "mine"

        [[rules]]
        pattern = '(.*/)?kernel'
        layouts = [["...", "model"]]
    """,
}


def blocks(path):
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(path.read_text())]


def save_scripts(path, directory):
    """Write the doc's Python blocks that start with a file name (`# train.py`) there, for its commands to run."""
    for lang, code in blocks(path):
        first = code.splitlines()[0] if code else ""
        if lang == "python" and re.fullmatch(r"# [\w/]+\.py", first):
            (directory / first[2:]).write_text(code)


def _env(cache):
    env = clean_env()
    env.update({"KDIST_FAKE_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "COLUMNS": "100"})
    env.update(compilation_cache_env(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """A JAX compilation cache for this session, shared by pytest-xdist's workers (their base folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-compilation-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def project(tmp_path):
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    return tmp_path


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_says_what_it_is(path):
    untagged = [lang for lang, _ in blocks(path) if lang not in LANGUAGES]
    assert not untagged, f"{path.name}: code blocks need a language from {sorted(LANGUAGES)}; found {untagged}"
    for lang, code in blocks(path):
        if lang == "toml":
            tomllib.loads(code)
        elif lang == "json":
            json.loads(code)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, project, compile_cache):
    code = "\n\n".join(code for lang, code in blocks(path) if lang == "python")
    if not code:
        pytest.skip("no Python block")
    save_scripts(path, project)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=_env(compile_cache), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{path.name}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def _commands(path):
    """Shell lines to run: every line of a `bash` block, the `$ ` lines of a `console` block (the rest is output)."""
    for lang, code in blocks(path):
        for line in code.splitlines():
            if lang == "bash" or (lang == "console" and line.startswith("$ ")):
                line = line.removeprefix("$ ").strip()
                if line and not line.startswith(("#", *INSTALL_STEPS)):
                    yield line


COMMANDS = [(path, line) for path in DOCS for line in _commands(path)]


@pytest.mark.parametrize("path, line", COMMANDS, ids=[f"{p.name}: {line[:60]}" for p, line in COMMANDS])
def test_shell_commands_run(path, line, project, compile_cache):
    assert line.startswith("kdist "), f"{path.name}: a shell line the docs test does not know how to run: {line!r}"
    argv = shlex.split(line, comments=True)[1:]
    save_scripts(path, project)
    env = _env(compile_cache)
    del env["KDIST_FAKE_DEVICES"]  # each command picks its own devices
    # Each launch compiles its own: under jax 0.12.1 two run at once by pytest-xdist's workers with one persistent
    # cache hung in a process's fetch of a value (2026-12-06).
    if argv[0] == "launch":
        for name in compilation_cache_env(compile_cache):
            del env[name]
    result = subprocess.run(
        [sys.executable, "-m", "kdist", *argv], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode in (0, 1), f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


PATH_MENTION = re.compile(r"`((?:tests|benchmarks|kdist|docs|notebooks)/[\w./-]*)`")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_the_docs_name_exists(path):
    missing = [name for name in PATH_MENTION.findall(path.read_text()) if not (ROOT / name).exists()]
    assert not missing, f"{path.name} names files that do not exist: {missing}"
