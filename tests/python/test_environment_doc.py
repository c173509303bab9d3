"""docs/environment.md lists every environment variable the library reads (issue 27), and
nothing else: the sources are scanned for DLSLIME_* names in string literals and for the
names passed to getenv() and its wrappers, so neither the page nor the code can drift."""

import ast
import functools
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "environment.md"
LIBRARY_DIRS = ("src", "include", "python/dlslime")
# The benchmark, scripts, tests and examples: the page's last section, read by them only.
TOOL_DIRS = ("bench", "scripts", "tests", "examples")
TOOL_SECTION = "## Benchmark, scripts and tests"

DLSLIME_NAME = re.compile(r"DLSLIME_[A-Z0-9_]+")
# C++ reads: std::getenv("X"), the env.h parsers, and the path variable of a SharedLibrary
# (its third argument, always a string literal or kHixlPluginPathVariable's).
CPP_READ = re.compile(r'\b(?:getenv|env_integer|env_flag)\(\s*"([A-Za-z_][A-Za-z0-9_]*)"')

# DLSLIME_* names that stand in the library's string literals but are not environment
# variables. Keep it to names checked by hand, each with what it is.
NOT_ENVIRONMENT = {
    # A CMake cache variable (src/ascend/CMakeLists.txt) passed as a compile definition; the
    # literal is the text of an #error in src/ascend/hixl_plugin.cpp.
    "DLSLIME_HIXL_FLAVOUR",
}


def cpp_string_literals(text):
    """The contents of the string literals of C++ source text (raw strings too), comments
    and character literals skipped."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif text.startswith('R"', i) and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            paren = text.index("(", i + 2)
            close = ")" + text[i + 2:paren] + '"'
            end = text.index(close, paren)
            out.append(text[paren + 1:end])
            i = end + len(close)
        elif text[i] in "\"'":
            if text[i] == "'" and i > 0 and text[i - 1].isdigit():  # a digit separator: 60'000
                i += 1
                continue
            quote, j = text[i], i + 1
            while text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            if quote == '"':
                out.append(text[i + 1:j])
            i = j + 1
        else:
            i += 1
    return out


def is_environ(node):
    """os.environ or environ."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def python_reads(tree):
    """Names read with os.environ.get("X"), os.environ["X"] or os.getenv("X")."""
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            if isinstance(f, ast.Attribute) and (
                    (f.attr == "get" and is_environ(f.value)) or (f.attr == "getenv")):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant):
                key = node.slice.value
        if isinstance(key, str):
            yield key


def library_sources():
    for d in LIBRARY_DIRS:
        for path in sorted((REPO / d).rglob("*")):
            if path.suffix == ".py" or path.name.endswith((".cpp", ".h", ".cpp.in", ".h.in")):
                yield path


@functools.lru_cache(maxsize=None)
def scan_library():
    """(every DLSLIME_* name in a string literal, every name read through a getenv call,
    all string literal text) of the library's sources, names mapped to the files they are in."""
    literal_names, read_names, literals = {}, {}, []
    for path in library_sources():
        text = path.read_text()
        where = str(path.relative_to(REPO))
        if path.suffix == ".py":
            tree = ast.parse(text, filename=where)
            strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            reads = list(python_reads(tree))
        else:
            strings = cpp_string_literals(text)
            reads = CPP_READ.findall(text)
        literals.extend(strings)
        for s in strings:
            for name in DLSLIME_NAME.findall(s):
                # A prefix such as "DLSLIME_TCP_*" in a message names a family, not a variable.
                if not name.endswith("_"):
                    literal_names.setdefault(name, set()).add(where)
        for name in reads:
            read_names.setdefault(name, set()).add(where)
    return literal_names, read_names, literals


def doc_tables():
    """The first-column names of the page's tables: (library rows, tool rows)."""
    text = DOC.read_text()
    library_part, _, tool_part = text.partition(TOOL_SECTION)
    assert tool_part, f"docs/environment.md has no section '{TOOL_SECTION}'"
    row = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \|", re.M)
    return row.findall(library_part), row.findall(tool_part)


def test_the_scanner_finds_the_variables_it_must():
    """The scan itself works: a few variables read in different ways are found (a scanner
    that finds nothing would pass every test below)."""
    literal_names, read_names, _ = scan_library()
    for name in ("DLSLIME_TCP_LANES", "DLSLIME_IO_THREADS", "DLSLIME_RDMA_SIM", "DLSLIME_IBVERBS_LIBRARY",
                 "DLSLIME_ASCEND_HIXL_PLUGIN", "DLSLIME_BENCH_BIN"):
        assert name in literal_names, name
    for name in ("DLSLIME_NANOCTRL_TOKEN", "NANOCTRL_REDIS_URL", "SLIME_VISIBLE_DEVICES", "DLSLIME_BENCH_BIN"):
        assert name in read_names, name
    # Comments do not count, nor do macros next to a literal: "a" MACRO "b" is two literals.
    text = r'''// "DLSLIME_IN_A_COMMENT"
/* "DLSLIME_TOO" */ x = "a" DLSLIME_MACRO "b\"" R"x(raw "quoted")x" 60'000 + '"';'''
    assert cpp_string_literals(text) == ["a", 'b\\"', 'raw "quoted"']


def test_every_variable_in_the_sources_is_on_the_page():
    literal_names, read_names, _ = scan_library()
    doc = DOC.read_text()
    missing = {
        name: sorted(files)
        for name, files in {**literal_names, **read_names}.items()
        if name not in NOT_ENVIRONMENT and not re.search(rf"`{re.escape(name)}`", doc)
    }
    assert not missing, f"environment variables not in docs/environment.md: {missing}"


def test_every_library_row_is_read_by_the_library():
    library_rows, _ = doc_tables()
    assert len(library_rows) == len(set(library_rows)), "a variable has two rows"
    _, _, literals = scan_library()
    text = "\n".join(literals)
    stale = [name for name in library_rows if not re.search(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", text)]
    assert not stale, f"rows of docs/environment.md that no library source names: {stale}"


def test_every_tool_row_is_read_by_a_tool():
    _, tool_rows = doc_tables()
    this_file = pathlib.Path(__file__).resolve()
    texts = [p.read_text(errors="replace") for d in TOOL_DIRS for p in (REPO / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".sh", ".cpp", ".h", ".txt") and p.resolve() != this_file]
    text = "\n".join(texts)
    stale = [name for name in tool_rows if not re.search(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", text)]
    assert not stale, f"rows of docs/environment.md's last section that nothing in {TOOL_DIRS} names: {stale}"


def test_the_allowlist_names_only_what_the_sources_hold():
    """An entry of NOT_ENVIRONMENT that the sources no longer hold is removed, not kept."""
    literal_names, _, _ = scan_library()
    assert NOT_ENVIRONMENT <= set(literal_names), NOT_ENVIRONMENT - set(literal_names)
    doc = DOC.read_text()
    for name in NOT_ENVIRONMENT:
        assert f"`{name}`" not in doc, f"{name} is not an environment variable but the page lists it"
