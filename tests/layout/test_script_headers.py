"""Static checks of the Lua scripts: documented headers, keys only from KEYS, they load.

The key check is a small Lua lexer plus a data-flow heuristic: the key argument of every
``redis.call`` must be ``KEYS[...]``, a local bound to ``KEYS[...]``, a call of a local
function that returns ``KEYS[...]``, a parameter of the enclosing function whose every
call site passes one of those, or a field ``c.NAME`` (or a call ``c.NAME(...)``) whose every
assignment (``NAME = ...`` in a table constructor, ``x.NAME = ...``) is one of those.
Anything else (``'ns:' .. ARGV[1]``, a string literal, a
concatenation) is a key built inside the script, which breaks Redis Cluster routing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pytest
import redis
from fixtures.scripts import *  # noqa: F403

from batchq.store import scripts
from batchq.store.scripts import calls

pytestmark = pytest.mark.script

SCRIPT_DIR = Path(str(resources.files("batchq.store.scripts")))
SCRIPT_FILES = sorted(p for p in SCRIPT_DIR.glob("*.lua") if not p.name.startswith("_"))
LIBRARY_FILES = sorted(SCRIPT_DIR.glob("_*.lua"))
KEYLESS_COMMANDS = {"time", "echo", "ping", "publish"}  # a channel is not a key
NUMKEYS_COMMANDS = {"lmpop"}  # numkeys, then the keys


# --- a small Lua lexer ---------------------------------------------------------------------

KEYWORDS = {
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}


@dataclass(frozen=True)
class Tok:
    kind: str  # name, kw, str, num, op
    text: str
    pos: int


_LONG_OPEN = re.compile(r"\[(=*)\[")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUM = re.compile(r"0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+")
_OPS = ("...", "..", "==", "~=", "<=", ">=", "::")


def lex(src: str) -> list[Tok]:
    out: list[Tok] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
            continue
        if src.startswith("--", i):
            m = _LONG_OPEN.match(src, i + 2)
            if m:
                close = "]" + m.group(1) + "]"
                end = src.find(close, m.end())
                i = n if end < 0 else end + len(close)
            else:
                end = src.find("\n", i)
                i = n if end < 0 else end + 1
            continue
        if c in "'\"":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(Tok("str", src[i + 1 : j], i))
            i = j + 1
            continue
        m = _LONG_OPEN.match(src, i)
        if m:
            close = "]" + m.group(1) + "]"
            end = src.find(close, m.end())
            out.append(Tok("str", src[m.end() : end], i))
            i = end + len(close)
            continue
        m = _NAME.match(src, i)
        if m:
            word = m.group(0)
            out.append(Tok("kw" if word in KEYWORDS else "name", word, i))
            i = m.end()
            continue
        m = _NUM.match(src, i)
        if m:
            out.append(Tok("num", m.group(0), i))
            i = m.end()
            continue
        for op in _OPS:
            if src.startswith(op, i):
                out.append(Tok("op", op, i))
                i += len(op)
                break
        else:
            out.append(Tok("op", c, i))
            i += 1
    return out


def split_args(toks: list[Tok], open_idx: int) -> tuple[list[list[Tok]], int]:
    """The comma-separated arguments of the call whose '(' is at ``open_idx``."""
    args: list[list[Tok]] = [[]]
    depth = 0
    i = open_idx
    while True:
        t = toks[i]
        if t.text in "([{" and t.kind == "op":
            depth += 1
            if depth > 1:
                args[-1].append(t)
        elif t.text in ")]}" and t.kind == "op":
            depth -= 1
            if depth == 0:
                return ([] if args == [[]] else args), i
            args[-1].append(t)
        elif t.text == "," and t.kind == "op" and depth == 1:
            args.append([])
        else:
            args[-1].append(t)
        i += 1


# --- the analysis --------------------------------------------------------------------------


@dataclass
class Func:
    name: str | None
    params: list[str]
    returns: list[list[Tok]] = field(default_factory=list)


@dataclass
class KeyUse:
    where: str  # a description for failure messages
    expr: list[Tok]
    func: Func | None  # innermost enclosing function


@dataclass
class Analysis:
    funcs: dict[str, Func] = field(default_factory=dict)
    key_locals: set[str] = field(default_factory=set)
    key_uses: list[KeyUse] = field(default_factory=list)
    calls: list[tuple[str, list[list[Tok]], Func | None, int]] = field(default_factory=list)
    fields: dict[str, list[list[Tok]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def text(expr: list[Tok]) -> str:
    return " ".join(t.text for t in expr)


def multi_keys(toks: list[Tok], j: int) -> list[str]:
    """The names of ``local a, b = KEYS[1], KEYS[2]`` starting at ``toks[j]`` (every value
    a ``KEYS[<number>]``), else []."""
    names = []
    while toks[j].kind == "name":
        names.append(toks[j].text)
        if toks[j + 1].text != ",":
            break
        j += 2
    j += 1
    if toks[j].text != "=":
        return []
    for n, _ in enumerate(names):
        k = j + 1 + 5 * n
        if [t.text for t in toks[k:k + 4:3]] != ["KEYS", "]"] or toks[k + 2].kind != "num" \
                or (n < len(names) - 1 and toks[k + 4].text != ","):
            return []
    return names


def analyse(src: str) -> Analysis:
    toks = lex(src)
    a = Analysis()
    # block stack: entries are a Func (function block) or None (other blocks)
    stack: list[Func | None] = []
    pending_do = 0  # 'for'/'while' open a block closed by 'end'; their 'do' must not count
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "kw" and t.text == "function":
            j = i + 1
            name = None
            if toks[j].kind == "name":
                name = toks[j].text
                j += 1
                while toks[j].text in (".", ":"):
                    name += toks[j].text + toks[j + 1].text
                    j += 2
            params, close = split_args(toks, j)
            f = Func(name, [p[0].text for p in params if p])
            if name:
                a.funcs[name] = f
            stack.append(f)
            i = close + 1
            continue
        if t.kind == "kw" and t.text in ("for", "while"):
            pending_do += 1
            stack.append(None)
        elif t.kind == "kw" and t.text == "do":
            if pending_do:
                pending_do -= 1
            else:
                stack.append(None)
        elif t.kind == "kw" and t.text in ("if", "repeat"):
            stack.append(None)
        elif t.kind == "kw" and t.text in ("end", "until"):
            stack.pop()
        elif t.kind == "kw" and t.text == "return":
            fn = next((f for f in reversed(stack) if f is not None), None)
            expr: list[Tok] = []
            j = i + 1
            depth = 0
            while j < len(toks):
                u = toks[j]
                if u.kind == "op" and u.text in "([{":
                    depth += 1
                elif u.kind == "op" and u.text in ")]}":
                    depth -= 1
                if depth == 0 and u.kind == "kw" and u.text in (
                        "end", "else", "elseif", "local", "if", "for", "while", "until"):
                    break
                expr.append(u)
                j += 1
            if fn is not None:
                fn.returns.append(expr)
        elif (t.kind == "name" and i + 1 < len(toks) and toks[i + 1].text == "="
              and i > 0 and toks[i - 1].text in ("{", ",", ".")):
            # a field assigned (in a constructor, or x.NAME = ...): its value, to the next
            # "," or closing bracket at its own depth, or the end of the line
            line_end = src.find("\n", toks[i + 1].pos)
            line_end = len(src) if line_end < 0 else line_end
            val: list[Tok] = []
            depth = 0
            for u in toks[i + 2:]:
                if u.kind == "op" and u.text in "([{":
                    depth += 1
                elif u.kind == "op" and u.text in ")]}":
                    if depth == 0:
                        break
                    depth -= 1
                elif depth == 0 and (u.text == "," or u.pos > line_end):
                    break
                val.append(u)
            a.fields.setdefault(t.text, []).append(val)
        elif (t.kind == "kw" and t.text == "local" and toks[i + 1].kind == "name"
              and toks[i + 2].text == "," and multi_keys(toks, i + 1)):
            a.key_locals.update(multi_keys(toks, i + 1))
        elif (t.kind == "kw" and t.text == "local" and toks[i + 1].kind == "name"
              and toks[i + 2].text == "=" and toks[i + 3].text == "KEYS"):
            _, close = split_args(toks, i + 4)
            follow = toks[close + 1] if close + 1 < len(toks) else None
            if follow is None or follow.text not in ("..", ".", ":", "(", "[", ","):
                a.key_locals.add(toks[i + 1].text)
        elif (t.kind == "name" and t.text == "redis" and toks[i + 1].text == "."
              and toks[i + 2].text in ("call", "pcall")):
            args, close = split_args(toks, i + 3)
            fn = next((f for f in reversed(stack) if f is not None), None)
            where = f"redis.call({text(args[0]) if args else ''}, ...) at {t.pos}"
            if not args or len(args[0]) != 1 or args[0][0].kind != "str":
                a.errors.append(f"{where}: the command is not a string literal")
            elif args[0][0].text.lower() not in KEYLESS_COMMANDS:
                # LMPOP numkeys key ...: its first key follows the count
                at = 2 if args[0][0].text.lower() in NUMKEYS_COMMANDS else 1
                if len(args) <= at:
                    a.errors.append(f"{where}: no key argument")
                else:
                    a.key_uses.append(KeyUse(where, args[at], fn))
            i = close + 1
            continue
        elif (t.kind == "name" and i + 1 < len(toks) and toks[i + 1].text == "("
              and (i == 0 or toks[i - 1].text not in ("function", ".", ":"))):
            args, _ = split_args(toks, i + 1)
            fn = next((f for f in reversed(stack) if f is not None), None)
            a.calls.append((t.text, args, fn, t.pos))
        i += 1
    assert not stack, "unbalanced blocks: the lexer or the block tracker is wrong"
    return a


def is_keys_index(expr: list[Tok]) -> bool:
    if len(expr) < 4 or expr[0].text != "KEYS" or expr[1].text != "[" or expr[-1].text != "]":
        return False
    inner = expr[2:-1]
    return bool(inner) and all(t.kind != "str" and t.text != ".." for t in inner)


def key_violations(src: str) -> list[str]:
    """Every key argument that is not provably taken from KEYS."""
    a = analyse(src)
    problems = list(a.errors)
    checked: set[tuple[str, int]] = set()

    def safe(expr: list[Tok], fn: Func | None, where: str, seen: frozenset[str]) -> bool:
        if is_keys_index(expr):
            return True
        if len(expr) == 1 and expr[0].kind == "name":
            name = expr[0].text
            if name in a.key_locals:
                return True
            if fn is not None and fn.name and name in fn.params:
                # a parameter: safe if every caller passes a key there
                idx = fn.params.index(name)
                if (fn.name, idx) not in checked:
                    checked.add((fn.name, idx))
                    sites = [c for c in a.calls if c[0] == fn.name]
                    for _, args, caller, pos in sites:
                        arg = args[idx] if idx < len(args) else []
                        if not safe(arg, caller, f"{fn.name}(...) at {pos}", seen):
                            problems.append(
                                f"{fn.name}(...) at {pos}: argument {idx + 1} "
                                f"({text(arg)!r}) is used as a key but not taken from KEYS")
                return True  # the call sites are reported on their own
            return False
        if (len(expr) >= 3 and expr[0].kind == "name" and expr[1].text == "."
                and expr[2].kind == "name" and "." + expr[2].text not in seen):
            vals = a.fields.get(expr[2].text, [])
            inner = seen | {"." + expr[2].text}
            if len(expr) == 3:  # c.NAME: every value assigned to the field is a key
                return bool(vals) and all(safe(v, None, where, inner) for v in vals)
            if expr[3].text == "(" and expr[-1].text == ")":  # c.NAME(...): a key function
                return bool(vals) and all(
                    len(v) == 1 and v[0].text in a.funcs and bool(a.funcs[v[0].text].returns)
                    and all(safe(r, a.funcs[v[0].text], where, inner)
                            for r in a.funcs[v[0].text].returns) for v in vals)
            return False
        if (len(expr) >= 3 and expr[0].kind == "name" and expr[1].text == "("
                and expr[-1].text == ")" and expr[0].text in a.funcs
                and expr[0].text not in seen):
            f = a.funcs[expr[0].text]
            return bool(f.returns) and all(
                safe(r, f, where, seen | {f.name or ""}) for r in f.returns)
        return False

    for use in a.key_uses:
        if not safe(use.expr, use.func, use.where, frozenset()):
            problems.append(f"{use.where}: key argument {text(use.expr)!r} is not from KEYS")
    return problems


# --- the checker catches what it should ----------------------------------------------------


@pytest.mark.parametrize("lua", [
    "redis.call('GET', 'ns:' .. ARGV[1])",
    "redis.call('DEL', KEYS[1] .. ':x')",
    "redis.call('DEL', ARGV[1])",
    "local k = KEYS[1] .. ':x'\nredis.call('DEL', k)",
    "local function f(key)\n  redis.call('DEL', key)\nend\nf(KEYS[1])\nf('x' .. ARGV[1])",
    "local function k(p)\n  return 'q:' .. p\nend\nredis.call('LPUSH', k(1), 'v')",
    "local c = 'DEL'\nredis.call(c, KEYS[1])",
    "for i = 1, 3 do\n  redis.call('DEL', KEYS[1] .. i)\nend",
    "redis.call('LMPOP', 1, 'q:' .. ARGV[1], 'LEFT')",
    "redis.call('LMPOP', KEYS[1])",
    "local c = {k = KEYS[1], j = 'x'}\nredis.call('DEL', c.j)",
    "local c = {k = KEYS[1]}\nc.k = 'x' .. ARGV[1]\nredis.call('DEL', c.k)",
    "local c = {}\nredis.call('DEL', c.k)",
    "local function r(p)\n  return 'q' .. p\nend\nlocal c = {r = r}\nredis.call('DEL', c.r(1))",
])
def test_checker_flags_keys_built_in_the_script(lua):
    assert key_violations(lua), lua


@pytest.mark.parametrize("lua", [
    "redis.call('DEL', KEYS[1])",
    "redis.call('TIME')",
    "local k = KEYS[2]\nif true then redis.call('DEL', k) end",
    "local function f(key)\n  redis.call('DEL', key)\nend\nf(KEYS[1])\nf(KEYS[2])",
    "local function rk(p)\n  return KEYS[8 + 9 - p]\nend\nredis.call('RPUSH', rk(3), 'x')",
    "for k = 8, 17 do\n  redis.call('LPOP', KEYS[k], 2)\nend",
    "redis.call('LMPOP', 2, KEYS[1], KEYS[2], 'LEFT', 'COUNT', 5)",
    "-- redis.call('DEL', 'x' .. y) in a comment\nlocal s = \"redis.call('GET', 'k')\"",
    "local c = {k = KEYS[1], n = 3}\nlocal function f(c)\n  redis.call('DEL', c.k)\nend\nf(c)",
    "local function r(p)\n  return KEYS[8 + p]\nend\nlocal c = {r = r}\nredis.call('DEL', c.r(1))",
])
def test_checker_accepts_keys_from_keys(lua):
    assert key_violations(lua) == []


# --- the real scripts ----------------------------------------------------------------------


def test_every_script_file_is_a_known_script():
    assert sorted(p.stem for p in SCRIPT_FILES) == sorted(scripts.NAMES)


def header_of(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:])
    return "\n".join(lines)


def body_of(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: p.name)
def test_header_documents_keys_argv_and_return(path):
    header = header_of(path)
    assert header.lstrip().startswith(f"{path.name}:"), "header must start with the file name"
    assert re.search(r"\bKEYS\[\d+\]", header), "KEYS not documented"
    assert re.search(r"\bARGV\b", header), "ARGV not documented"
    assert re.search(r"\bReturns\b", header), "return value not documented"

    documented: set[int] = set()
    for lo, hi in re.findall(r"\bKEYS\[(\d+)(?:\.\.(\d+))?\]", header):
        documented.update(range(int(lo), int(hi or lo) + 1))
    assert documented == set(range(1, max(documented) + 1)), "KEYS documentation has gaps"

    body = body_of(path)
    used = {int(n) for n in re.findall(r"\bKEYS\[(\d+)\]", body)}
    used |= {n for _, n in phase_keys(path)}
    assert used, "the script takes no key from KEYS"
    assert used <= documented, f"KEYS{sorted(used - documented)} used but not documented"

    argv_single = {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", header)}
    argv_open = [int(n) for n in re.findall(r"\bARGV\[(\d+)\.\.", header)]
    argv_bare = re.search(r"\bARGV(?!\[)", header) is not None
    for n in {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", body)}:
        assert argv_bare or n in argv_single or any(n >= lo for lo in argv_open), (
            f"ARGV[{n}] used but not documented")


@pytest.mark.parametrize("name", scripts.NAMES)
def test_script_takes_every_key_from_keys(name):
    src = scripts.source(name)
    # not vacuous: the script's own top-level code does call Redis with keys
    assert any(u.func is None for u in analyse(src).key_uses)
    assert key_violations(src) == []


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=lambda p: p.name)
def test_library_helpers_take_keys_as_parameters(path):
    a = analyse(path.read_text(encoding="utf-8"))
    # the helpers touch keys only through their parameters (a key, or pop's context
    # c: c.NAME, c.NAME(...)), never KEYS or literals
    # the helpers touch keys only through their parameters, never literals; pop's
    # phases (_pop_*.lua) name theirs KEYS[NAME] (_pop_keys.lua)
    for use in a.key_uses:
        if path.name.startswith("_pop_") and (
                is_keys_index(use.expr) or text(use.expr) in a.key_locals):
            continue  # pop's phases name their keys: local a, b = KEYS[i], KEYS[j]
        assert len(use.expr) == 1 and use.func is not None, use.where
        assert use.expr[0].text in use.func.params, use.where


@pytest.mark.parametrize("name", scripts.NAMES)
def test_script_loads_on_the_server(redis_client: redis.Redis, name):
    src = scripts.source(name)
    sha = redis_client.script_load(src)
    assert sha == hashlib.sha1(src.encode()).hexdigest()
    assert redis_client.script_exists(sha) == [True]


@pytest.mark.parametrize("name", scripts.NAMES)
def test_script_loads_as_a_function(redis_client: redis.Redis, name):
    """Each script is also a function library (under 60 upvalues per function: Lua 5.1's
    limit, which the body's library names count against once it is a function)."""
    s = scripts.SyncScript(name, redis_client)
    redis_client.function_load(s.library, replace=True)
    libs = redis_client.function_list(library=s.fname)
    assert len(libs) == 1, libs
    flags = {f.decode() for f in dict(zip(libs[0][5][0][::2], libs[0][5][0][1::2],
                                          strict=True))[b"flags"]}
    assert flags == (set() if name in scripts.library.REFUSED_WHEN_FULL else {"allow-oom"})


def test_library_alone_compiles(redis_client: redis.Redis):
    lib = scripts._library()
    sha = redis_client.script_load(lib)
    assert redis_client.script_exists(sha) == [True]


# --- the call builders agree with the scripts ------------------------------------------------


def phase_keys(path: Path) -> list[tuple[str, int]]:
    """(name, slot) of the keys a script's phases (``_<script>_*.lua``: pop.lua's) name
    in their first lines, ``local a, b = KEYS[i], KEYS[j]``."""
    out = []
    for phase in sorted(path.parent.glob(f"_{path.stem}_*.lua")):
        decl = r"(?m)^  local ([\w, ]+) = (KEYS\[\d+\](?:, KEYS\[\d+\])*)$"
        for names, slots in re.findall(decl, phase.read_text(encoding="utf-8")):
            ns = [n.strip() for n in names.split(",")]
            ks = [int(k) for k in re.findall(r"\d+", slots)]
            assert len(ns) == len(ks), (phase.name, names, slots)
            out.extend(zip(ns, ks, strict=True))
    return out


def named_keys(path: Path) -> dict[int, str]:
    """KEYS slot -> name, from the ``local NAME = KEYS[n]`` lines at the top of a script
    (and ``local READY9 = n``: slots n..n+9 are ready9..ready0; ``local WAIT0 = n``:
    slots n..n+3 are waiting0..waiting3)."""
    out: dict[int, str] = {}
    for name, n in phase_keys(path):
        assert out.setdefault(n, name) == name, f"KEYS[{n}] named {out[n]} and {name}"
    phases = "".join(p.read_text(encoding="utf-8")
                     for p in sorted(path.parent.glob(f"_{path.stem}_*.lua")))
    for line in (body_of(path) + "\n" + phases).splitlines():
        line = line.strip()
        # (or "NAME = KEYS[n]," in a table constructor: pop.lua's context)
        m = re.match(r"(?:local |  )(\w+) = KEYS\[(\d+)\],?\s*$", line)
        if m:
            out[int(m.group(2))] = m.group(1)
        m = re.match(r"local (?:READY9|READY_AT) = (\d+)\b", line)
        if m:
            first = int(m.group(1))
            out.update({first + i: f"ready{9 - i}" for i in range(10)})
        # slots n..n+3: waiting0..waiting3
        m = re.match(r"local (?:WAIT0|WAITING_AT) = (\d+)\b", line)
        if m:
            first = int(m.group(1))
            out.update({first + i: f"waiting{i}" for i in range(4)})
    return out


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: p.name)
def test_builder_key_order_matches_the_script(path):
    order = calls.KEY_ORDER[path.stem]
    names = named_keys(path)
    assert sorted(names) == list(range(1, len(order) + 1)), "every KEYS slot named once"
    assert [names[i] for i in range(1, len(order) + 1)] == list(order)
    # the body uses only the named locals, never KEYS[...] directly (READY9 aside)
    body = "\n".join(line for line in body_of(path).splitlines()
                     if not re.match(r"(?:local |  )\w+ = KEYS\[\d+\],?\s*$", line))
    # (ack_result.lua: KEYS[RESULTS + j], one result key per job, after the named ones)
    assert re.findall(r"KEYS\[(?!READY9|RESULTS|WAIT0|[A-Z_]+\])", body) == []
    # and the header documents exactly the slots the builder fills
    documented: set[int] = set()
    for lo, hi in re.findall(r"\bKEYS\[(\d+)(?:\.\.(\d+))?\]", header_of(path)):
        documented.update(range(int(lo), int(hi or lo) + 1))
    assert documented == set(range(1, len(order) + 1))


def test_every_script_has_a_builder():
    assert set(calls.KEY_ORDER) == set(scripts.NAMES)


def test_builders_fill_keys_from_the_queue(namespace):
    from batchq.store.keys import QueueKeys

    k = QueueKeys(namespace, "q")
    c = calls.pop(k, 5, 1000, 100)
    assert c.keys[7:17] == list(k.ready) and c.keys[17:20] == [k.stats, k.recovered, k.started]
    assert c.keys[20:24] == [k.campaigns, k.jobmeta, k.dedup, k.dedup_exp]
    assert c.keys[24:32] == [k.pending, k.cancel, k.done, k.seq, k.waiting0, k.waiting1,
                             k.waiting2, k.waiting3]
    assert c.keys[32:] == [k.gready, k.groups, k.gwait, k.gstate, k.limits, k.idle, k.bundles,
                           k.evconf, k.events, k.expires]
    assert calls.enqueue(k, 3, [b"e"], check=False).keys[0] == k.ready_for(3)
    assert calls.nack(k, [(b"a:1", 5)], [(b"b:1", b"r")]).args == [1, b"a:1", 5, b"b:1", b"r"]


def test_builders_reuse_key_lists_per_queue_and_priority(namespace, monkeypatch):
    """Key lists are kept per (script, keys, priority): the same as built afresh, never
    shared between calls, distinct for another queue or priority, and bounded."""
    from batchq.store.keys import QueueKeys

    monkeypatch.setattr(calls, "_KEYS_CACHE", {})
    a, b = QueueKeys(namespace, "a"), QueueKeys(namespace, "b")
    first = calls.enqueue(a, 3, [b"e"], check=False).keys
    assert first == calls._build_keys("enqueue", a, 3)
    first.append("scribbled")  # a Call owns its list: the next call is not touched
    assert calls.enqueue(a, 3, [b"e"], check=False).keys == calls._build_keys("enqueue", a, 3)
    assert calls.enqueue(a, 7, [b"e"], check=False).keys[0] == a.ready_for(7)
    assert calls.enqueue(b, 3, [b"e"], check=False).keys[0] == b.ready_for(3)
    assert calls.pop(QueueKeys(namespace, "a"), 5, 1000, 100).keys == \
        calls._build_keys("pop", a, None)  # an equal QueueKeys finds the same entry
    assert len(calls._KEYS_CACHE) == 4
    monkeypatch.setattr(calls, "KEYS_CACHE_SIZE", 4)
    calls.ack(b, [b"x:1"])
    assert len(calls._KEYS_CACHE) == 1  # full: started over


def test_every_library_file_is_read_in_order():
    assert sorted(scripts.LIBRARY) == [p.name for p in LIBRARY_FILES]
    assert scripts.LIBRARY[0] == "_lib.lua"
    head, defs = scripts.definitions(scripts._library())
    assert head.startswith("-- _lib.lua")
    assert len(defs) > 60 and len({name for name, _ in defs}) == len(defs)


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=lambda p: p.name)
def test_library_splits_into_whole_definitions(path):
    """``scripts.definitions`` cuts a library file at column-0 ``local`` lines: the pieces
    give back the file, each function ends with its ``end``, each constant is one line."""
    lib = path.read_text(encoding="utf-8")
    head, defs = scripts.definitions(lib)
    assert head + "".join(text for _, text in defs) == lib
    assert defs and len({name for name, _ in defs}) == len(defs)
    assert head.startswith(f"-- {path.name}:")
    assert all(line.startswith("--") or not line for line in head.splitlines())
    for name, text in defs:
        code = [line for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("--")]
        if code[0].startswith("local function "):
            assert code[0].startswith(f"local function {name}(") and code[-1] == "end", name
        else:
            assert code == [code[0]] and code[0].startswith(f"local {name} = "), name
    # one definition a piece: every column-0 "local" line of the file starts its own
    assert [name for name, _ in defs] == \
        re.findall(r"(?m)^local (?:function )?([A-Za-z_]\w*)", lib)
    one_liner = "local function f() return 1 end\nlocal function g()\n  return f()\nend\n"
    assert [name for name, _ in scripts.definitions(one_liner)[1]] == ["f", "g"]
    with pytest.raises(ValueError, match="defines nothing"):
        scripts.definitions("local function f()\nend\nf()\n")


def test_a_script_gets_the_library_definitions_it_uses():
    lib = ("-- head\n\nlocal A = 1\n-- f: A\nlocal function f()\n  return A\nend\n\n"
           "local function g()\n  return f()\nend\n-- h: 2\nlocal function h()\n  return 2\nend\n")
    assert scripts.library_for(lib, "return g()") == \
        "-- head\n\nlocal A = 1\n-- f: A\nlocal function f()\n  return A\nend\n\n" \
        "local function g()\n  return f()\nend\n"
    assert scripts.library_for(lib, "return h()") == \
        "-- head\n\n-- h: 2\nlocal function h()\n  return 2\nend\n"
    assert scripts.library_for(lib, "return 1") == "-- head\n\n"
    # every name of the library the code of a sent script uses is defined in it
    names = {name for name, _ in scripts.definitions(
        (SCRIPT_DIR / "_lib.lua").read_text(encoding="utf-8"))[1]}
    for script in scripts.NAMES:
        src = scripts.source(script)
        code = re.sub(r"--.*", "", src)
        defined = set(re.findall(r"(?m)^local (?:function )?([A-Za-z_]\w*)", code))
        assert names & set(re.findall(r"[A-Za-z_]\w*", code)) <= defined, script
    assert "local function settle_tracked" not in scripts.source("extend")
    assert "local function settle_tracked" in scripts.source("ack")
