# SPDX-License-Identifier: MIT
"""The C sources' layout, as docs/architecture.md states it: a module's own header comes
first in its .c, and no two modules of a directory reach each other through their headers,
however long the way round (a module is foo.c with foo.h; a header of no .c, as the state
span_state.h holds, belongs to whoever includes it); and libclient's layers, which
tools/check-layers checks (its cycle() is the one used here)."""

import glob
import importlib.machinery
import importlib.util
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIRS = ["common", "daemon", "libclient"]
INCLUDE = re.compile(r'^#include "(\w+)\.h"', re.M)


def check_layers():
    """tools/check-layers, as a module: libclient's table of layers and its check."""
    path = os.path.join(ROOT, "tools", "check-layers")
    loader = importlib.machinery.SourceFileLoader("check_layers", path)
    spec = importlib.util.spec_from_loader("check_layers", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


cycle = check_layers().cycle


def modules(d):
    return {os.path.basename(p)[:-2] for p in glob.glob(os.path.join(ROOT, d, "*.c"))}


def includes(d, m):
    with open(os.path.join(ROOT, d, m + ".c"), encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


def test_cycle_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("d", DIRS)
def test_own_header_first(d):
    wrong = []
    for m in sorted(modules(d)):
        if os.path.exists(os.path.join(ROOT, d, m + ".h")):
            inc = includes(d, m)
            if not inc or inc[0] != m:
                wrong.append("%s/%s.c includes %s first" % (d, m, inc[0] if inc else "nothing"))
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("d", DIRS)
def test_no_cycle_between_modules(d):
    mods = modules(d)
    graph = {m: {i for i in includes(d, m) if i in mods and i != m} for m in mods}
    found = cycle(graph)
    assert found is None, "%s: %s" % (d, " -> ".join(found))


def test_libclient_in_layers():
    """No file of libclient reaches a layer above its own (tools/check-layers' table)."""
    errors = check_layers().check(os.path.join(ROOT, "libclient"))
    assert not errors, "\n".join(errors)


def test_every_module_of_the_binding_is_installed():
    """meson.build names the binding's modules one by one (py_sources): a module missing there
    is missing from every installed deval, whose import then fails."""
    with open(os.path.join(ROOT, "meson.build"), encoding="utf-8") as f:
        listed = set(re.findall(r"'python/deval/(\w+\.py)'", f.read()))
    here = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "python", "deval", "*.py"))}
    assert here - listed == set(), "not in meson.build's py_sources: %s" % sorted(here - listed)
