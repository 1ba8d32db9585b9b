"""Rust source as the import check sees it: a lexer (identifiers, `::`, punctuation; comments,
strings, chars, lifetimes and numbers dropped) and a parser of each file's module tree, items,
`use` declarations and qualified paths (test code left out)."""

import os
import re

# ---------------------------------------------------------------------------------------------
# Lexer: identifiers, `::`, single-character punctuation; comments, strings, chars, lifetimes and
# numbers are dropped (they cannot name a path).

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RAW_STR = re.compile(r'(?:br|cr|r)(#*)"')


def lex(text):
    """Tokens of Rust source as (text, line) pairs."""
    toks = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += text[i] == "\n"
                    i += 1
        elif c in "brc" and _RAW_STR.match(text, i):
            m = _RAW_STR.match(text, i)
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            toks.append(('"' + text[m.end() : end - 1 - len(m.group(1))] + '"', line))
            line += text.count("\n", i, end)
            i = end
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            start = i = text.index('"', i) + 1
            first = line
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                line += text[i] == "\n" if i < n else 0
                i += 1
            toks.append(('"' + text[start:i] + '"', first))  # kept for #[path = "..."]
            i += 1
        elif c == "'" or (c == "b" and text.startswith("'", i + 1)):
            q = text.index("'", i)
            if text.startswith("\\", q + 1):  # escaped char literal: '\n', '\'', '\u{..}'
                j = q + 3
                while j < n and text[j] != "'":
                    j += 1
                i = j + 1
            elif q + 2 < n and text[q + 2] == "'":  # 'x'
                i = q + 3
            else:  # a lifetime or label
                m = _IDENT.match(text, q + 1)
                i = m.end() if m else q + 1
        elif c == "r" and text.startswith("r#", i) and _IDENT.match(text, i + 2):
            m = _IDENT.match(text, i + 2)
            toks.append((m.group(0), line))
            i = m.end()
        elif c.isalpha() or c == "_":
            m = _IDENT.match(text, i)
            if m is None:  # a non-ASCII letter: not in this project's identifiers
                i += 1
                continue
            toks.append((m.group(0), line))
            i = m.end()
        elif c.isdigit():
            i += 1
            while i < n and (text[i].isalnum() or text[i] == "_" or
                             (text[i] == "." and i + 1 < n and text[i + 1].isdigit())):
                i += 1
        elif text.startswith("::", i):
            toks.append(("::", line))
            i += 2
        else:
            toks.append((c, line))
            i += 1
    return toks


def is_ident(tok):
    return bool(_IDENT.fullmatch(tok))


_CLOSE = {"(": ")", "[": "]", "{": "}"}


def matching(toks, i):
    """Index of the bracket closing the one at `i` (or the end)."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j][0]
        if t in _CLOSE:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


# ---------------------------------------------------------------------------------------------
# Parser: one Module per `mod` (file or inline block), with its items, imports and code paths.

ITEM_KEYWORDS = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}


class Import:
    """One leaf of a `use` tree: a name it binds, or a glob."""

    def __init__(self, segs, name, glob, public, line):
        self.segs = segs  # path segments as written (`crate`, `super`, ...)
        self.name = name  # the name it binds (None: a glob or `as _`)
        self.glob = glob
        self.public = public  # `pub` / `pub(...)`: possibly a re-export
        self.line = line


class Module:
    """A module: a file, or an inline `mod name { .. }` block of one."""

    def __init__(self, name, file, parent, inline=False):
        self.name = name
        self.file = file  # the file it lives in (an inline module: its parent's file)
        self.parent = parent
        self.inline = inline  # `mod name { ... }`
        self.children = {}  # name -> Module (test modules left out)
        self.items = set()  # names of the items defined here
        self.imports = []  # Import
        self.bindings = {}  # name -> [Import]
        self.globs = []  # Import
        self.refs = []  # (segments, line): qualified paths in the code
        self.idents = {}  # identifier -> first line, in the code (not in `use` declarations)
        self.target = None  # the Target it belongs to

    def root(self):
        m = self
        while m.parent is not None:
            m = m.parent
        return m


class Target:
    """A crate target (library, binary, test, ...): the module tree of one root file."""

    def __init__(self, package, root_file):
        self.package = package  # Package
        self.root_file = root_file
        self.files = set()
        self.root = None


def attributes_before(toks, i):
    """Attribute token texts (joined) written right before the item at `i`, and the item start."""
    attrs = []
    j = i
    while True:
        k = j - 1
        if k >= 0 and toks[k][0] == "]":
            depth, k2 = 0, k
            while k2 >= 0:
                t = toks[k2][0]
                if t == "]":
                    depth += 1
                elif t == "[":
                    depth -= 1
                    if depth == 0:
                        break
                k2 -= 1
            if k2 >= 1 and toks[k2 - 1][0] == "#":
                attrs.append("".join(t for t, _ in toks[k2 + 1 : k]))
                j = k2 - 1
                continue
        return attrs, j


def visibility_start(toks, i):
    """Start of `pub`, `pub(...)` written before the keyword at `i` (or `i`), and whether pub."""
    j = i
    # qualifiers between the visibility and the keyword
    while j > 0 and toks[j - 1][0] in ("unsafe", "async", "extern", "const", "default"):
        j -= 1
    if j > 0 and toks[j - 1][0] == ")":
        k = j - 1
        while k > 0 and toks[k][0] != "(":
            k -= 1
        if k > 0 and toks[k - 1][0] == "pub":
            return k - 1, True
    if j > 0 and toks[j - 1][0] == "pub":
        return j - 1, True
    return j, False


def test_only(attr):
    """Whether an attribute (tokens joined) is `cfg(test)` or `cfg(all(.., test, ..))`."""
    if attr == "cfg(test)":
        return True
    m = re.fullmatch(r"cfg\(all\((.*)\)\)", attr)
    if not m:
        return False
    depth, term, terms = 0, "", []
    for c in m.group(1) + ",":
        if c == "," and depth == 0:
            terms.append(term)
            term = ""
            continue
        depth += (c == "(") - (c == ")")
        term += c
    return "test" in terms


def is_test_attr(attrs):
    return any(test_only(a) for a in attrs)


def item_end(toks, i):
    """Index of the last token of the item starting at `i`: its `;` or its body's `}`."""
    j = i
    while j < len(toks):
        t = toks[j][0]
        if t == ";":
            return j
        if t == "{":
            return matching(toks, j)
        if t in ("(", "["):
            j = matching(toks, j)
        j += 1
    return len(toks) - 1


def parse_use_tree(toks, i, prefix, out):
    """Parses a use tree starting at `i`; appends (segments, bound name, glob, line). Returns the
    index after the tree."""
    segs = list(prefix)
    line = toks[i][1] if i < len(toks) else 0
    if i < len(toks) and toks[i][0] == "::":  # `::name`: an external crate
        segs.append("::")
        i += 1
    while i < len(toks):
        t, line = toks[i]
        if t == "{":
            end = matching(toks, i)
            j = i + 1
            while j < end:
                j = parse_use_tree(toks, j, segs, out)
                if j < end and toks[j][0] == ",":
                    j += 1
                elif j < end:  # unexpected: skip to the next comma
                    while j < end and toks[j][0] != ",":
                        j += 1
                    j += 1
            return end + 1
        if t == "*":
            out.append((segs, None, True, line))
            return i + 1
        if t == "$" and i + 1 < len(toks) and toks[i + 1][0] == "crate":
            segs.append("crate")
            i += 2
        elif is_ident(t):
            segs.append(t)
            i += 1
        else:
            return i
        if i < len(toks) and toks[i][0] == "::":
            i += 1
            continue
        break
    name = segs[-1] if segs else None
    if segs and segs[-1] == "self":
        segs = segs[:-1]
        name = segs[-1] if segs else None
    if i + 1 < len(toks) and toks[i][0] == "as":
        name = toks[i + 1][0]
        name = None if name == "_" else name
        i += 2
    if segs:
        out.append((segs, name, False, line))
    return i


def scan_paths(toks, lo, hi, module, skip):
    """Records the qualified paths and identifiers of toks[lo:hi] (outside the `skip` spans)."""
    i = lo
    while i < hi:
        if i in skip:
            i = skip[i] + 1
            continue
        t, line = toks[i]
        dollar_crate = t == "crate" and i > 0 and toks[i - 1][0] == "$"
        if is_ident(t) and (i == 0 or toks[i - 1][0] not in ("::", ".") or dollar_crate):
            segs = [t]
            j = i + 1
            while j + 1 < hi and toks[j][0] == "::" and is_ident(toks[j + 1][0]) and j + 1 not in skip:
                segs.append(toks[j + 1][0])
                j += 2
            if t not in module.idents:
                module.idents[t] = line
            if len(segs) > 1:
                module.refs.append((segs, line))
            i = j
            continue
        i += 1


class Parser:
    def __init__(self, package_dir):
        self.package_dir = package_dir
        self.errors = []

    def rel(self, path):
        return os.path.relpath(path, self.package_dir)

    def load_target(self, package, root_file):
        target = Target(package, self.rel(root_file))
        target.root = self.load_file(target, root_file, None, None, mod_rs=True)
        return target

    def load_file(self, target, path, name, parent, mod_rs):
        rel = self.rel(path)
        if os.path.basename(path) == "tests.rs":
            return None
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            self.errors.append(f"{rel}: {e.strerror}")
            return None
        target.files.add(rel)
        module = Module(name, rel, parent)
        module.target = target
        toks = lex(text)
        # A file's submodules live in its folder (mod.rs, lib.rs, main.rs, crate roots) or in a
        # folder named after it.
        base = os.path.dirname(path)
        if not mod_rs:
            base = os.path.join(base, os.path.splitext(os.path.basename(path))[0])
        self.parse_body(target, toks, 0, len(toks), module, base)
        return module

    def parse_body(self, target, toks, lo, hi, module, base):
        skip = {}  # start -> end of spans not scanned for paths (uses, tests, inline modules)
        depth = 0
        i = lo
        while i < hi:
            t, line = toks[i]
            if t in ("{", "(", "["):
                depth += 1
            elif t in ("}", ")", "]"):
                depth -= 1
            prev = toks[i - 1][0] if i > 0 else ""
            if t == "#" and i + 1 < hi and toks[i + 1][0] == "[":
                # an outer attribute: if test-only, skip the item (or statement) it is on
                end = matching(toks, i + 1)
                attr = "".join(x for x, _ in toks[i + 2 : end])
                if test_only(attr):
                    j = end + 1
                    while j < hi and toks[j][0] == "#":  # further attributes
                        j = matching(toks, j + 1) + 1
                    stop = item_end(toks, j)
                    skip[i] = stop
                    i = stop + 1
                    continue
            if prev in ("::", "."):
                i += 1
                continue
            if t == "use":
                start, public = visibility_start(toks, i)
                attrs, _ = attributes_before(toks, start)
                out = []
                j = parse_use_tree(toks, i + 1, [], out)
                while j < hi and toks[j][0] != ";":
                    j += 1
                skip[start] = j
                if not is_test_attr(attrs):
                    for segs, name, glob, uline in out:
                        imp = Import(segs, name, glob, public and depth == 0, uline)
                        module.imports.append(imp)
                        if glob:
                            module.globs.append(imp)
                        elif name is not None:
                            module.bindings.setdefault(name, []).append(imp)
                i = j + 1
                continue
            if t == "mod" and i + 1 < hi and is_ident(toks[i + 1][0]):
                name = toks[i + 1][0]
                start, _ = visibility_start(toks, i)
                attrs, _ = attributes_before(toks, start)
                test = is_test_attr(attrs) or name == "tests"
                if i + 2 < hi and toks[i + 2][0] == "{":
                    end = matching(toks, i + 2)
                    skip[i] = end
                    if not test:
                        child = Module(name, module.file, module, inline=True)
                        child.target = target
                        module.children[name] = child
                        self.parse_body(target, toks, i + 3, end, child, os.path.join(base, name))
                    i = end + 1
                    continue
                if not test:
                    child = self.load_module_file(target, module, name, attrs, base)
                    if child is not None:
                        module.children[name] = child
                skip[i] = i + 1
                i += 2
                continue
            if depth == 0 and t in ITEM_KEYWORDS and i + 1 < hi and is_ident(toks[i + 1][0]):
                k = i + 2 if toks[i + 1][0] == "mut" else i + 1
                name = toks[k][0] if k < hi else ""
                if is_ident(name) and name not in ("fn", "unsafe", "async", "extern", "_"):
                    module.items.add(name)
            if depth == 0 and t == "macro_rules" and i + 2 < hi and toks[i + 1][0] == "!":
                module.items.add(toks[i + 2][0])
            i += 1
        scan_paths(toks, lo, hi, module, skip)

    def load_module_file(self, target, parent, name, attrs, base):
        for a in attrs:
            m = re.fullmatch(r'path="(.*)"', a)
            if m:
                # #[path] is relative to the folder of the declaring file; inside an inline
                # module, to the folder its submodules would be in.
                declaring = os.path.join(self.package_dir, parent.file)
                folder = base if parent.inline else os.path.dirname(declaring)
                path = os.path.normpath(os.path.join(folder, m.group(1)))
                return self.load_file(target, path, name, parent, mod_rs=False)
        for candidate, mod_rs in ((os.path.join(base, name + ".rs"), False),
                                  (os.path.join(base, name, "mod.rs"), True)):
            if os.path.isfile(candidate):
                return self.load_file(target, candidate, name, parent, mod_rs)
        if not (attrs and any(a.startswith("cfg(") for a in attrs)):
            self.errors.append(f"{self.rel(os.path.join(base, name))}.rs: file of `mod {name}` not found "
                               f"(declared in {parent.file})")
        return None
