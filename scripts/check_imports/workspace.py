"""The workspace: members of the root Cargo.toml, the targets of each, and the circles of all."""

import os

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

from .graph import circles, target_edges
from .rust import Parser


class UsageError(Exception):
    """A bad workspace or argument: exit 2."""


# ---------------------------------------------------------------------------------------------
# Workspace: members of the root Cargo.toml, the targets of each.

class Package:
    def __init__(self, label, path):
        self.label = label
        self.path = path


def read_toml(path):
    with open(path, "rb") as f:
        data = f.read()
    if tomllib is not None:
        try:
            return tomllib.loads(data.decode("utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: {e}")
    raise UsageError("needs Python 3.11 or later (tomllib)")


def workspace_packages(root):
    manifest = os.path.join(root, "Cargo.toml")
    if not os.path.isfile(manifest):
        raise UsageError(f"{manifest}: no such file")
    doc = read_toml(manifest)
    members = doc.get("workspace", {}).get("members")
    if members is None:
        members = ["."] if "package" in doc else []
    packages = []
    for member in members:
        path = os.path.normpath(os.path.join(root, member))
        if not os.path.isfile(os.path.join(path, "Cargo.toml")):
            raise UsageError(f"workspace member {member}: no Cargo.toml")
        packages.append(Package(member, path))
    return packages


def target_roots(package):
    """The root files of a package's targets: the conventional places and explicit `path`s."""
    p = package.path
    roots = []

    def add(path):
        path = os.path.normpath(path)
        if os.path.isfile(path) and path not in roots:
            roots.append(path)

    doc = read_toml(os.path.join(p, "Cargo.toml"))
    if "path" in doc.get("lib", {}):
        add(os.path.join(p, doc["lib"]["path"]))
    for section in ("bin", "test", "bench", "example"):
        for t in doc.get(section, []):
            if "path" in t:
                add(os.path.join(p, t["path"]))
    add(os.path.join(p, "src", "lib.rs"))
    add(os.path.join(p, "src", "main.rs"))
    for folder in ("src/bin", "tests", "benches", "examples"):
        d = os.path.join(p, folder)
        if not os.path.isdir(d):
            continue
        for entry in sorted(os.listdir(d)):
            full = os.path.join(d, entry)
            if entry.endswith(".rs"):
                add(full)
            elif os.path.isdir(full):
                add(os.path.join(full, "main.rs"))
    return roots


def check_workspace(root):
    """[(package label, circle, edges)], and the errors met (files not found)."""
    results = []
    errors = []
    for package in workspace_packages(root):
        parser = Parser(package.path)
        seen = set()
        for root_file in target_roots(package):
            target = parser.load_target(package, root_file)
            if target.root is None:
                continue
            edges = target_edges(target)
            for c in circles(edges):
                key = tuple(c)
                if key not in seen:
                    seen.add(key)
                    results.append((package.label, c, edges))
        errors.extend(f"{package.label}: {e}" for e in parser.errors)
    return results, errors


def all_edges(root):
    out = []
    for package in workspace_packages(root):
        parser = Parser(package.path)
        for root_file in target_roots(package):
            target = parser.load_target(package, root_file)
            if target.root is None:
                continue
            for (a, b), why in sorted(target_edges(target).items()):
                line, text = min(why)
                out.append(f"{package.label} [{target.root_file}]: {a} -> {b}  ({a}:{line} {text})")
    return out
