"""Every ```python block of README.md and docs/*.md runs, so the docs cannot drift (issue 27).

A block runs as written, in a fresh Python process (cwd = the repository root, a deadline,
DLSLIME_TCP_ADVERTISE_INTERFACE=lo so that nothing is advertised on another interface),
unless an HTML comment on the line right before its fence says otherwise:

    <!-- doc-test: not-run: REASON: what it lacks -->
        Not run; REASON is one of NOT_RUN_REASONS (a fragment that uses names it never
        defines, two hosts, a rebuild). Such a block is still compiled (its syntax is
        checked), and the table NOT_RUN below lists every one by file and section, so
        they are skipped by name, in this file, never silently.

    <!-- doc-test: TOKEN TOKEN ... -->
        Run, with these changes (any combination):
        nanoctrl      `http://127.0.0.1:4479` in the block is the suite's NanoCtrl
                      (DLSLIME_TEST_CTRL_URL, else one in this process)
        redis         `redis://127.0.0.1:6379` in the block is the suite's Redis
                      (DLSLIME_TEST_REDIS_URL, else a redis-server started here)
        two-process   two processes run the block at once; in each, the one line that
                      assigns `peer_info` (`peer_info = ...`, `peer_info = exchange(...)`)
                      becomes one that hands this side's `ep.endpoint_info()` to the other
                      process over a pipe and returns the other's (so the block names its
                      endpoint `ep`). Everything else runs exactly as written. Repeated
                      DLSLIME_DOC_REPEAT times (default 20; 50 by hand).
        needs=gpu|rdma|npu
                      the hardware the block needs (GPU, RDMA NIC, Ascend NPU), checked in
                      the block's environment: with a simulation variable among the tokens
                      the block runs on the simulation, and it is skipped, naming the
                      hardware, only where neither the hardware nor the simulation is there
        NAME=VALUE    an environment variable of the block (e.g. DLSLIME_GPU_SIM=1)

A failure names the doc file and the line of the fence and shows the process's stderr;
tracebacks point at the doc's own line numbers (the block is compiled under its file name).
"""

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEFAULT_CTRL_URL = "http://127.0.0.1:4479"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
BLOCK_TIMEOUT = 60  # seconds per process: a block that hangs fails instead
REPEAT = int(os.environ.get("DLSLIME_DOC_REPEAT", "20"))

NOT_RUN_REASONS = {
    "fragment": "uses names the page defines in its prose or that the caller brings (a, b, buf, exchange, ...)",
    "two hosts": "needs a second host",
    "rebuild": "needs a build or an install step",
}
# Every block marked not-run: (doc file, the heading above it) -> reason. A new not-run
# marker needs its row here, so each one is chosen in review.
NOT_RUN = {
    ("docs/api.md", "Notifications"): "fragment",
    ("docs/api.md", "Completion without blocking"): "fragment",
    ("docs/nvlink.md", "NVLinkEndpoint"): "fragment",
    ("docs/deploy.md", "4. An agent on each host"): "two hosts",
}
HARDWARE = {  # needs= value -> (what to call it, Python that prints "" when it is there, else why not)
    "gpu": ("a GPU", "from dlslime import testing; print(testing.gpu_unavailable_reason())"),
    "rdma": ("an RDMA NIC", "import dlslime; t = {x['name']: x for x in dlslime.available_transports()}; "
             "print('' if t['rdma']['available'] else t['rdma']['reason'] or 'not built')"),
    "npu": ("an Ascend NPU", "import dlslime; t = {x['name']: x for x in dlslime.available_transports()}; "
            "print('' if t['ascend']['available'] else t['ascend']['reason'] or 'not built')"),
}
MARKER = re.compile(r"^<!-- doc-test: (.*?) -->$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
HEADING = re.compile(r"^#+ (.*)$")
PEER_INFO_LINE = re.compile(r"^(\s*)peer_info = .*$")
ENV_TOKEN = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S*)$")

# Runs one block: argv = doc path, file holding the block's source (padded so that its line
# numbers are the doc's), and for two-process blocks the pipe ends to the other process.
DRIVER = textwrap.dedent("""
    import json, os, sys
    doc, source, fds = sys.argv[1], sys.argv[2], sys.argv[3:]

    def __doc_exchange__(info):
        out_fd, in_fd = map(int, fds)
        with os.fdopen(out_fd, "w") as out:
            out.write(json.dumps(info) + "\\n")
        with os.fdopen(in_fd) as inp:
            line = inp.readline()
        if not line:
            raise RuntimeError("the other process ended before it sent its endpoint_info")
        return json.loads(line)

    with open(source) as f:
        code = compile(f.read(), doc, "exec")
    sys.argv = [doc]
    exec(code, {"__name__": "__main__", "__doc_exchange__": __doc_exchange__})
""")


class Block:
    def __init__(self, doc, line, source, marker, marker_line, heading):
        self.doc = doc                  # path relative to the repository, e.g. "docs/tcp.md"
        self.line = line                # 1-based line of the opening fence
        self.source = source            # the block's lines, dedented, without the fences
        self.marker = marker            # the marker's text, or None
        self.marker_line = marker_line
        self.heading = heading          # the nearest heading above, without the #s
        self.not_run = None             # (reason, note) for not-run blocks
        self.tokens = []
        self.env = {}
        self.needs = None
        self.errors = []
        if marker is not None:
            self._parse(marker)

    def _parse(self, marker):
        if marker.startswith("not-run"):
            m = re.match(r"^not-run: ([^:]+): (\S.*)$", marker)
            if not m:
                self.errors.append(f"'{marker}' is not 'not-run: REASON: what it lacks'")
            elif m.group(1) not in NOT_RUN_REASONS:
                self.errors.append(f"not-run reason '{m.group(1)}' is none of {sorted(NOT_RUN_REASONS)}")
            else:
                self.not_run = (m.group(1), m.group(2))
            return
        for token in marker.split():
            env = ENV_TOKEN.match(token)
            if env:
                self.env[env.group(1)] = env.group(2)
            elif token.startswith("needs="):
                self.needs = token[len("needs="):]
                if self.needs not in HARDWARE:
                    self.errors.append(f"needs={self.needs}: not one of {sorted(HARDWARE)}")
            elif token in ("nanoctrl", "redis", "two-process"):
                self.tokens.append(token)
            else:
                self.errors.append(f"unknown token '{token}' in '{marker}'")
        if "two-process" in self.tokens:
            lines = [ln for ln in self.source.splitlines() if PEER_INFO_LINE.match(ln)]
            if len(lines) != 1:
                self.errors.append(f"a two-process block has exactly one 'peer_info = ...' line, not {len(lines)}")
        if "nanoctrl" in self.tokens and DEFAULT_CTRL_URL not in self.source:
            self.errors.append(f"marked nanoctrl but does not name {DEFAULT_CTRL_URL}")
        if "redis" in self.tokens and DEFAULT_REDIS_URL not in self.source:
            self.errors.append(f"marked redis but does not name {DEFAULT_REDIS_URL}")

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    def padded(self, source=None):
        """The source with blank lines in front, so that its line numbers are the doc's."""
        return "\n" * self.line + (source if source is not None else self.source)


def collect(paths=DOC_FILES, root=REPO):
    """(python blocks, problems: stray markers and unclosed fences)."""
    blocks, problems = [], []
    for path in paths:
        doc = str(path.relative_to(root))
        lines = path.read_text().splitlines()
        heading, i = "", 0
        pending = None  # (marker text, line number) of a marker waiting for its fence
        while i < len(lines):
            text = lines[i]
            marker, fence, head = MARKER.match(text.strip()), FENCE.match(text), HEADING.match(text)
            if pending and not (fence and fence.group(2) in ("python", "py")):
                problems.append(f"{doc}:{pending[1]}: a doc-test marker must be the line right before a ```python "
                                "fence")
                pending = None
            if marker:
                pending = (marker.group(1), i + 1)
            elif head:
                heading = head.group(1).strip()
            elif fence:
                indent, lang, start = fence.group(1), fence.group(2), i
                body = []
                i += 1
                while i < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[i]):
                    body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                    i += 1
                if i == len(lines):
                    problems.append(f"{doc}:{start + 1}: a ```{lang} fence is never closed")
                if lang in ("python", "py"):
                    blocks.append(Block(doc, start + 1, "\n".join(body) + "\n",
                                        pending[0] if pending else None, pending[1] if pending else None, heading))
                pending = None
            i += 1
    return blocks, problems


BLOCKS, PROBLEMS = collect()
RUNNABLE = [b for b in BLOCKS if b.not_run is None and not b.errors]


# --- the markers ---------------------------------------------------------------------------

def test_the_docs_have_python_blocks_and_the_markers_are_well_formed():
    assert len(BLOCKS) >= 10, f"found only {len(BLOCKS)} python blocks: is the parser broken?"
    errors = PROBLEMS + [f"{b.doc}:{b.marker_line}: {e}" for b in BLOCKS for e in b.errors]
    assert not errors, "\n".join(errors)


def test_the_not_run_blocks_are_exactly_the_listed_ones():
    found = {}
    for b in BLOCKS:
        if b.not_run:
            key = (b.doc, b.heading)
            assert key not in found or found[key] == b.not_run[0], f"{b.where}: two not-run reasons under one heading"
            found[key] = b.not_run[0]
    listing = "\n".join(f"  {doc} ({heading}): not-run: {reason}" for (doc, heading), reason in sorted(found.items()))
    assert found == NOT_RUN, f"the not-run blocks differ from NOT_RUN in {__file__}; found:\n{listing}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run], ids=lambda b: b.where)
def test_a_block_that_is_not_run_still_compiles(block):
    try:
        compile(block.padded(), block.doc, "exec")
    except SyntaxError as e:
        pytest.fail(f"{block.where} ({block.heading}; not-run: {block.not_run[0]}): {e}")


def test_the_marker_parser_refuses_what_it_must():
    """The checks above can fail: an unknown reason, a missing note, an unknown token, a
    two-process block without its peer_info line, and a stray marker."""
    src = "x = 1\n"
    assert Block("d.md", 3, src, "not-run: too slow: takes a minute", 2, "h").errors
    assert Block("d.md", 3, src, "not-run: fragment", 2, "h").errors
    assert not Block("d.md", 3, src, "not-run: fragment: uses x", 2, "h").errors
    assert Block("d.md", 3, src, "two-process", 2, "h").errors
    assert not Block("d.md", 3, "peer_info = ...\n", "two-process", 2, "h").errors
    assert Block("d.md", 3, src, "needs=tpu", 2, "h").errors
    assert Block("d.md", 3, src, "sometimes", 2, "h").errors
    assert Block("d.md", 3, src, "nanoctrl", 2, "h").errors
    with tempfile.TemporaryDirectory() as tmp:
        bad = pathlib.Path(tmp) / "bad.md"
        bad.write_text("<!-- doc-test: nanoctrl -->\n\n```python\nx = 1\n```\n```\n# not a heading\n```\n"
                       "```py\ny = 2\n")
        blocks, problems = collect([bad], pathlib.Path(tmp))
    assert len(problems) == 2 and "right before" in problems[0] and "never closed" in problems[1], problems
    assert [(b.line, b.marker, b.heading) for b in blocks] == [(3, None, ""), (9, None, "")]


# --- running them ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def redis_url():
    url = os.environ.get("DLSLIME_TEST_REDIS_URL")
    if url:
        yield url
        return
    from nanoctrl_fixtures import RedisServer

    with RedisServer() as server:
        yield server.url


def block_env(block):
    env = dict(os.environ)
    env.pop("DLSLIME_TCP_ADVERTISE_HOST", None)  # exclusive with the interface
    env["DLSLIME_TCP_ADVERTISE_INTERFACE"] = "lo"
    env.update(block.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def hardware_missing(block, env):
    """Why the hardware the block needs is not here, in the block's environment; "" if it is."""
    what, probe = HARDWARE[block.needs]
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT)
    assert proc.returncode == 0, f"checking for {what} failed:\n{proc.stderr}"
    reason = proc.stdout.strip()
    return f"{block.where} needs {what}: {reason}" if reason else ""


def source_for(block, ctrl, redis):
    source = block.source
    if "nanoctrl" in block.tokens:
        source = source.replace(DEFAULT_CTRL_URL, ctrl)
    if "redis" in block.tokens:
        source = source.replace(DEFAULT_REDIS_URL, redis)
    if "two-process" in block.tokens:
        source = "\n".join(PEER_INFO_LINE.sub(r"\1peer_info = __doc_exchange__(ep.endpoint_info())", ln)
                           for ln in source.splitlines()) + "\n"
    return block.padded(source)


def failure(block, what, procs):
    parts = [f"{block.where} ({block.heading}): {what}"]
    for i, (rc, out, err) in enumerate(procs):
        label = f"process {i + 1}" if len(procs) > 1 else "process"
        parts.append(f"--- {label}: exit {rc}\n--- stdout:\n{out[-3000:]}\n--- stderr:\n{err[-6000:]}")
    return "\n".join(parts)


def run_once(block, source_file, env):
    """Runs the block (two processes for two-process); returns [(rc, stdout, stderr)] and
    whether a deadline passed."""
    doc = block.doc
    if "two-process" not in block.tokens:
        try:
            p = subprocess.run([sys.executable, "-c", DRIVER, doc, source_file], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            return [(None, e.stdout or "", e.stderr or "")], True
        return [(p.returncode, p.stdout, p.stderr)], False
    a_to_b, b_to_a = os.pipe(), os.pipe()
    ends = [(a_to_b[1], b_to_a[0]), (b_to_a[1], a_to_b[0])]
    procs = []
    try:
        for out_fd, in_fd in ends:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", DRIVER, doc, source_file, str(out_fd), str(in_fd)], env=env, cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(out_fd, in_fd)))
    finally:
        for fd in (*a_to_b, *b_to_a):
            os.close(fd)  # the children hold them now; a child that dies leaves the other EOF
    results, timed_out = [], False
    for p in procs:
        try:
            out, err = p.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                q.kill()
            out, err = p.communicate()
        results.append((p.returncode, out, err))
    return results, timed_out


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_the_block_runs(block, tmp_path, request):
    env = block_env(block)
    if block.needs:
        missing = hardware_missing(block, env)
        if missing:
            pytest.skip(missing)
    ctrl = request.getfixturevalue("ctrl_url") if "nanoctrl" in block.tokens else None
    redis = request.getfixturevalue("redis_url") if "redis" in block.tokens else None
    source_file = tmp_path / "block.py"
    source_file.write_text(source_for(block, ctrl, redis))
    runs = REPEAT if "two-process" in block.tokens else 1
    failed = []  # (run, what, results); every run goes on, so the count says how often
    for n in range(runs):
        results, timed_out = run_once(block, str(source_file), env)
        if timed_out or any(rc != 0 for rc, _, _ in results):
            failed.append((n + 1, f"did not finish within {BLOCK_TIMEOUT} s" if timed_out else "failed", results))
    if failed:
        n, what, results = failed[0]
        if runs > 1:
            what = f"{len(failed)} of {runs} runs failed (runs {[f[0] for f in failed]}); run {n} {what}"
        pytest.fail(failure(block, what, results), pytrace=False)


def test_the_hardware_probes_answer_here():
    """Each needs= probe runs and answers: "" (the hardware or its simulation is here) or a
    reason naming the hardware, never a crash (a block would then fail, not skip)."""
    for key, (what, _) in HARDWARE.items():
        block = Block("docs/x.md", 1, "pass\n", f"needs={key}", 0, "h")
        env = block_env(block)
        for sim in ("DLSLIME_GPU_SIM", "DLSLIME_RDMA_SIM", "DLSLIME_ASCEND_SIM"):
            env.pop(sim, None)
        missing = hardware_missing(block, env)
        assert missing == "" or missing.startswith(f"docs/x.md:1 needs {what}: "), missing


def test_the_two_process_harness_exchanges_the_infos_and_reports_a_failing_side(tmp_path):
    """The harness itself: each side gets the other's endpoint_info in place of its
    `peer_info = ...` line, and a side that fails fails the run, naming the doc's line."""
    lines = ["import os", "class Endpoint:", "    def endpoint_info(self):", "        return {'pid': os.getpid()}",
             "ep = Endpoint()", "peer_info = ...", "assert peer_info['pid'] != os.getpid(), 'got its own info'"]
    block = Block("docs/x.md", 7, "\n".join(lines) + "\n", "two-process", 6, "h")
    f = tmp_path / "block.py"
    f.write_text(source_for(block, None, None))
    results, timed_out = run_once(block, str(f), block_env(block))
    assert not timed_out and [rc for rc, _, _ in results] == [0, 0], results
    f.write_text(source_for(block, None, None).replace("!=", "=="))
    results, timed_out = run_once(block, str(f), block_env(block))
    assert not timed_out and [rc for rc, _, _ in results] == [1, 1], results
    assert 'File "docs/x.md", line 14' in results[0][2] and "got its own info" in results[0][2], results[0][2]
