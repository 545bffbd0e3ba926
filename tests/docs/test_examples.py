"""Every example in the docs runs: README.md and the site's pages under docs/.

Fenced ``python`` blocks run in order, one subprocess each, per page, against the
session's Redis (``BATCHQ_REDIS_URL``) with the ``batchq`` namespace emptied before the
page; a block titled ``title="name.py"`` is written to the page's working directory as
that module instead, for the blocks after it to import. A block marked ``python skip``
is not run. The ``batchq ...`` and ``python -m ...`` command lines of ``console``,
``sh`` and ``bash`` blocks are parsed by the real parsers (nothing runs). Snippets
(``--8<-- "snippets/x.md"``) are expanded into the pages that include them, so their
examples run too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
TITLE = re.compile(r'title="([^"]+)"')
BLOCK_TIMEOUT_S = 90.0
NAMESPACE = "batchq"  # the default namespace, which every example's App() uses


def pages() -> list[Path]:
    """README.md and every page of the site (snippets are expanded, not pages)."""
    found = [REPO / "README.md"]
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).parts
        if rel[0] not in ("snippets", "hooks"):
            found.append(path)
    return found


def expand(path: Path, depth: int = 0) -> str:
    """The page's text with its snippets included; a snippet not written yet is empty
    (``check_paths: false`` in mkdocs.yml)."""
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = SNIPPET.match(line)
        if m is None or depth > 3:
            out.append(line)
            continue
        for base in (DOCS, REPO):
            target = base / m.group(1)
            if target.is_file():
                out.append(expand(target, depth + 1))
                break
    return "\n".join(out)


@dataclass(frozen=True)
class Block:
    lang: str
    info: str
    line: int
    code: str

    @property
    def title(self) -> str | None:
        m = TITLE.search(self.info)
        return m.group(1) if m else None


def blocks(text: str) -> Iterator[Block]:
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, ticks, info = m.group("indent"), m.group("ticks"), m.group("info").strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            line = lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        lang = info.split()[0] if info else ""
        yield Block(lang, info, i + 1, "\n".join(body) + "\n")
        i = j + 1


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def _empty_namespace(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for pattern in (f"{NAMESPACE}:*", f"{{{NAMESPACE}:*"):
            batch = list(client.scan_iter(match=pattern, count=1000))
            for k in range(0, len(batch), 500):
                client.delete(*batch[k:k + 500])
    finally:
        client.close()


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_python_examples_run(page: Path, redis_url: str, tmp_path: Path) -> None:
    runnable = [b for b in blocks(expand(page)) if b.lang == "python"]
    if not any("skip" not in b.info.split()[1:] for b in runnable):
        pytest.skip("no Python example on this page")
    _empty_namespace(redis_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update(BATCHQ_REDIS_URL=redis_url, PYTHONPATH=os.pathsep.join([str(tmp_path),
                                                                       str(REPO)]))
    for n, block in enumerate(runnable):
        if "skip" in block.info.split()[1:]:
            continue
        if block.title is not None:
            (tmp_path / block.title).write_text(block.code, encoding="utf-8")
            continue
        script = tmp_path / f"example_{n}.py"
        script.write_text(block.code, encoding="utf-8")
        code, stdout, stderr = _run(script, tmp_path, env)
        assert code == 0, (
            f"{page_id(page)}:{block.line}: the example exited {code}\n"
            f"--- code\n{block.code}--- stdout\n{stdout}--- stderr\n{stderr}")


def _run(script: Path, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run one example in a process group of its own, so the workers it starts go with
    it (at its end, or at the time limit)."""
    proc = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return -1, stdout, stderr + f"\n(killed after {BLOCK_TIMEOUT_S:.0f} s)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, stdout, stderr


# --- command lines --------------------------------------------------------------------

def command_lines(block: Block) -> Iterator[str]:
    """The commands of a console (``$ ``-prompted lines) or shell block, continuation
    lines joined, comments dropped."""
    raw = block.code.splitlines()
    if block.lang == "console":
        raw = [x[2:] for x in raw if x.startswith("$ ")]
    joined: list[str] = []
    acc = ""
    for line in raw:
        if line.rstrip().endswith("\\"):
            acc += line.rstrip()[:-1] + " "
            continue
        joined.append(acc + line)
        acc = ""
    for line in joined:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        # `A && B`, `A &`: each command on its own
        cmd: list[str] = []
        for w in [*words, "&&"]:
            if w in ("&&", "&", "||", ";", "|"):
                if cmd:
                    yield shlex.join(cmd)
                cmd = []
            else:
                cmd.append(w)


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value batchq ...
        words = words[1:]
    return words


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None if the parser accepts ``argv``, else what it printed."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip() or f"exit {exc.code}"
    return None


def _batchq_parser() -> argparse.ArgumentParser:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    return cli_reference.root_parser()


def _check_module_command(argv: list[str]) -> str | None:
    """``python -m MODULE ...``: the harness's parser for ``bench``; for any other
    module, its ``--help`` must exist and name every flag the example uses."""
    module, rest = argv[2], argv[3:]
    if module == "bench":
        sys.path.insert(0, str(REPO))
        from bench.__main__ import build_parser

        return _parse(build_parser(), rest)
    words = [w for w in rest if not w.startswith("-")][:1] if module == "batchq" else []
    proc = subprocess.run([sys.executable, "-m", module, *words, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return f"`python -m {module} --help` exited {proc.returncode}: {proc.stderr[-500:]}"
    flags = {w.split("=")[0] for w in rest if w.startswith("--")}
    missing = sorted(f for f in flags if f not in proc.stdout)
    return f"not in its --help: {missing}" if missing else None


def shell_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in [*pages(), REPO / "bench" / "README.md"]:
        # the harness's commands quoted inline with options (the Performance page's table)
        for m in re.finditer(r"`(python -m bench(?:\.[a-z_.]+)?(?: [^`-][^` ]*)* -[^`]*)`",
                             expand(page)):
            found.append((f"{page_id(page)} (inline)", m.group(1)))
        for block in blocks(expand(page)):
            if block.lang not in ("console", "sh", "bash", "shell"):
                continue
            for command in command_lines(block):
                argv = _argv(command)
                if argv[:1] == ["batchq"] or argv[:2] in (["python", "-m"], ["python3", "-m"]):
                    found.append((f"{page_id(page)}:{block.line}", command))
    return found


@pytest.mark.parametrize(("where", "command"), shell_commands())
def test_shell_commands_parse(where: str, command: str) -> None:
    argv = _argv(command)
    if argv[0] == "batchq":
        problem = _parse(_batchq_parser(), argv[1:])
    else:
        problem = _check_module_command(argv)
    assert problem is None, f"{where}: `{command}` is refused: {problem}"


def test_the_docs_have_examples() -> None:
    """The extraction above finds what it should (so the tests cannot pass on nothing)."""
    python = sum(1 for p in pages() for b in blocks(expand(p)) if b.lang == "python")
    assert python >= 15
    assert len(shell_commands()) >= 15
