"""Links between README.md and docs/ land somewhere: every relative link names a file of the
repository, and every #anchor a heading of the page it points to (GitHub's rule for heading
anchors). The docs were found pointing outside the repository and at renamed sections
(issue 27); this keeps them from drifting again."""

import os
import re

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                               if f.endswith(".md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    inside = False
    with open(os.path.join(REPO, path)) as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line.lstrip()):
                inside = not inside
                continue
            if not inside:
                yield n, line


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path):
    seen, out = {}, set()
    for _, line in prose_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = anchor(m.group(1))
            k = seen.get(a, 0)
            out.add(a if k == 0 else f"{a}-{k}")
            seen[a] = k + 1
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for n, line in prose_lines(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.abspath(os.path.join(REPO, dest)).startswith(REPO + os.sep):
                broken.append(f"{page}:{n}: {target} points outside the repository")
                continue
            if not os.path.exists(os.path.join(REPO, dest)):
                broken.append(f"{page}:{n}: {target}: no file {dest}")
                continue
            if frag and dest.endswith(".md") and frag not in anchors_of(dest):
                broken.append(f"{page}:{n}: {target}: {dest} has no heading with anchor #{frag}")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_matches_github():
    assert anchor("Same-host path") == "same-host-path"
    assert anchor("`TcpEndpoint` options (C++: `TcpOptions`)") == "tcpendpoint-options-c-tcpoptions"
    assert anchor("Ports and firewalls") == "ports-and-firewalls"
