"""The import graph of a target (paths resolved to the files that define what they name) and its
circles (strongly connected sets of files, each covered by shortest circles)."""

from collections import deque

# ---------------------------------------------------------------------------------------------
# Resolution: a path to the item it names (a file) or a module.

class Resolver:
    """Resolves paths through modules, imports and globs (which may lead in circles: `active`
    holds the lookups under way, so a lookup that comes back to itself gives up)."""

    def __init__(self):
        self.active = set()

    def start(self, module, segs):
        """(module, remaining segments, relative) where a path written in `module` starts."""
        if not segs or segs[0] == "::":
            return None
        if segs[0] == "crate":
            return module.root(), segs[1:], False
        if segs[0] == "self":
            return module, segs[1:], False
        if segs[0] == "super":
            m, k = module, 0
            while k < len(segs) and segs[k] == "super":
                if m.parent is None:
                    return None
                m, k = m.parent, k + 1
            return m, segs[k:], False
        return module, segs, True

    def resolve(self, module, segs):
        """What a path written in `module` names: ("item", file, name), ("module", Module),
        ("unknown", file) or None (outside the crate)."""
        s = self.start(module, segs)
        if s is None:
            return None
        m, rest, relative = s
        if relative and not self.in_scope(m, rest[0]):
            return None
        return self.walk(m, rest)

    def in_scope(self, m, name):
        return (name in m.children or name in m.items or name in m.bindings
                or any(self.glob_has(m, g, name) for g in m.globs))

    def glob_target(self, m, g):
        t = self.resolve(m, g.segs)
        return t[1] if t and t[0] == "module" else None

    def glob_has(self, m, g, name):
        key = ("glob", id(g), name)
        if key in self.active:
            return False
        self.active.add(key)
        try:
            t = self.glob_target(m, g)
            return t is not None and self.in_scope(t, name)
        finally:
            self.active.discard(key)

    def binding(self, m, name, want_module):
        """What `name` imported in `m` names (a module first when `want_module`)."""
        found = []
        for imp in m.bindings.get(name, []):
            key = ("bind", id(imp))
            if key in self.active:
                continue
            self.active.add(key)
            try:
                t = self.resolve(m, imp.segs)
            finally:
                self.active.discard(key)
            if t is not None:
                found.append(t)
        for t in found:
            if (t[0] == "module") == want_module:
                return t
        return found[0] if found else None

    def walk(self, m, segs):
        if not segs:
            return ("module", m)
        s, last = segs[0], len(segs) == 1
        if not last and s in m.children:
            return self.walk(m.children[s], segs[1:])
        if s in m.items:
            return ("item", m.file, s)
        if s in m.bindings:
            t = self.binding(m, s, want_module=not last)
            if t is None and s not in m.children:
                return None  # imported from another crate
            if t is not None:
                if t[0] == "module":
                    return self.walk(t[1], segs[1:])
                return t
        if s in m.children:
            return self.walk(m.children[s], segs[1:])
        found = []  # what each glob that has `s` gives (globs may lead back here)
        for g in m.globs:
            if self.glob_has(m, g, s):
                t = self.glob_target(m, g)
                key = ("walk", id(t), s)
                if key in self.active:
                    continue
                self.active.add(key)
                try:
                    found.append(self.walk(t, segs))
                finally:
                    self.active.discard(key)
        for t in found:
            if t is None or t[0] != "unknown":
                return t
        return ("unknown", m.file)


def modules_of(root):
    stack = [root]
    while stack:
        m = stack.pop()
        yield m
        stack.extend(m.children.values())


def target_edges(target):
    """Edges of a target's graph: {(from file, to file): [(line, what it names)]}."""
    r = Resolver()
    edges = {}

    def add(m, t, line, text):
        if t is None or t[0] == "module":
            return
        to = t[1]
        if to != m.file:
            edges.setdefault((m.file, to), []).append((line, text))

    for m in modules_of(target.root):
        for imp in m.imports:
            if imp.glob:
                continue
            t = r.resolve(m, imp.segs)
            if imp.public and (imp.name is None or imp.name not in m.idents):
                continue  # a re-export its own file does not use
            add(m, t, imp.line, "::".join(imp.segs))
        module_globs = []
        for g in m.globs:
            target_module = r.glob_target(m, g)
            if target_module is None:
                t = r.resolve(m, g.segs)  # `use Enum::*`
                if not g.public:
                    add(m, t, g.line, "::".join(g.segs) + "::*")
            else:
                module_globs.append((g, target_module))
        for name, line in m.idents.items():
            if name in m.items or name in m.bindings or name in m.children:
                continue
            # the glob whose module has the name itself first (others may reach it through globs)
            direct = sorted(module_globs, key=lambda gt: not (
                name in gt[1].items or name in gt[1].bindings or name in gt[1].children))
            for g, target_module in direct:
                if r.glob_has(m, g, name):
                    t = r.walk(target_module, [name])
                    add(m, t, line, f"{name} via {'::'.join(g.segs)}::*")
                    if t is None or t[0] != "unknown":
                        break
        for segs, line in m.refs:
            s = r.start(m, segs)
            if s is None:
                continue
            start, rest, relative = s
            if relative:
                head = rest[0]
                if head in start.items:
                    continue
                if head in start.bindings:
                    t = r.binding(start, head, want_module=True)
                    if t is None or t[0] != "module":
                        continue  # `Type::assoc`: the `use` of Type is the edge
                elif head not in start.children and not any(r.glob_has(start, g, head) for g in start.globs):
                    continue  # a type parameter, `Self`, an external crate
            add(m, r.walk(start, rest), line, "::".join(segs))
    return edges


# ---------------------------------------------------------------------------------------------
# Circles: strongly connected sets of files, each covered by shortest circles.

def strongly_connected(nodes, succ):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(succ.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_circle(start, succ, allowed):
    prev = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(succ.get(v, ())):
            if w not in allowed:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def circles(edges):
    """The shortest circle through each file of each strongly connected set of more than one file
    (lists of files, first == last, starting at the smallest; no circle twice)."""
    succ = {}
    nodes = set()
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
        nodes.update((a, b))
    found = []
    for comp in strongly_connected(nodes, succ):
        if len(comp) < 2:
            continue
        allowed, seen = set(comp), set()
        for v in comp:
            c = shortest_circle(v, succ, allowed)[:-1]
            k = c.index(min(c))
            c = c[k:] + c[:k]
            if tuple(c) not in seen:
                seen.add(tuple(c))
                found.append(c + [c[0]])
    return found
