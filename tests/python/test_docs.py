# SPDX-License-Identifier: MIT
"""The documentation's relative links: every link in README.md, docs/*.md and tests/README.md
that points into the repository names a file that exists and, for a Markdown file, a heading
it has. A page moved or a section renamed fails here rather than in a reader's browser."""

import glob
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAGES = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "tests", "README.md"),
         os.path.join(ROOT, "examples", "README.md")] + \
    sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path):
    """The page's lines outside fenced code blocks."""
    out, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                out.append(line)
    return out


def anchors(path):
    """The anchors a Markdown renderer makes of the page's headings (GitHub's rule: lower
    case, punctuation dropped, spaces to dashes, a repeated one numbered)."""
    seen, out = {}, set()
    for line in prose(path):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def links(path):
    for line in prose(path):
        line = re.sub(r"`[^`]*`", "", line)  # (code spans hold no links)
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # another site, or mail
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
    assert os.path.exists(page)
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(dest):
            broken.append("%s: no such file" % target)
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append("%s: no heading makes #%s" % (target, anchor))
    assert not broken, "%s: %s" % (os.path.relpath(page, ROOT), "; ".join(broken))


def test_every_page_is_checked():
    """The pages the README links to are the pages checked here."""
    linked = {os.path.normpath(os.path.join(ROOT, t.partition("#")[0]))
              for t in links(os.path.join(ROOT, "README.md")) if t.endswith(".md") or ".md#" in t}
    assert linked <= set(PAGES) | {os.path.join(ROOT, "NEWS.md")}, linked - set(PAGES)
