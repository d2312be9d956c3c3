#!/usr/bin/env python3
"""The file-level call graph of a built folder, and whether it has a cycle.

usage: scripts/callgraph.py BUILD_SUBDIR [BUILD_SUBDIR ...]
  e.g. scripts/callgraph.py build/coordinator

Every object file (.o) under the given folders is one node. File A calls
file B when A's undefined symbols (nm -u) include one that B defines
(nm --defined-only); taking a function's address to register it as a
callback counts as a call by the file that registers it, which is the
direction a layered design wants. Symbols defined outside these objects
(libc, libuv, common/) are left out. Prints each file's callees, the files
in layer order (callees first) and exits 1 with the cycle if there is one.
"""
import collections
import os
import subprocess
import sys


def symbols(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def node_name(obj):
    # CMake names objects "conn.c.o".
    base = os.path.basename(obj)
    return base[:-2] if base.endswith(".o") else base


def build_graph(dirs):
    objs = [os.path.join(root, f) for d in dirs for root, _, files in os.walk(d)
            for f in files if f.endswith(".o")]
    defined = {}
    for obj in objs:
        for sym in symbols(obj, "--defined-only", "-g"):
            if sym.startswith("DW.ref."):  # the C++ runtime's, in every nvcc object
                continue
            if sym in defined and defined[sym] != node_name(obj):
                print(f"warning: {sym} defined in {defined[sym]} and {node_name(obj)} "
                      "(a stale object? build afresh)", file=sys.stderr)
            defined[sym] = node_name(obj)
    graph = {node_name(obj): set() for obj in objs}
    for obj in objs:
        me = node_name(obj)
        for sym in symbols(obj, "-u"):
            callee = defined.get(sym)
            if callee and callee != me:
                graph[me].add(callee)
    return graph


def find_cycle(graph):
    """A cycle as a list of files, or None (depth-first search)."""
    state, stack = {}, []

    def visit(n):
        state[n] = "active"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "active":
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def layers(graph):
    """Files by layer: 0 calls nothing here, k calls only layers below k."""
    level = {}

    def depth(n):
        if n not in level:
            level[n] = 1 + max((depth(m) for m in graph[n]), default=-1)
        return level[n]

    by_level = collections.defaultdict(list)
    for n in graph:
        by_level[depth(n)].append(n)
    return [sorted(by_level[k]) for k in sorted(by_level)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    graph = build_graph(sys.argv[1:])
    if not graph:
        sys.exit("no object files under " + " ".join(sys.argv[1:]))
    for n in sorted(graph):
        print(f"{n:18} -> {', '.join(sorted(graph[n])) or '(nothing here)'}")
    cycle = find_cycle(graph)
    if cycle:
        print("CYCLE: " + " -> ".join(cycle))
        sys.exit(1)
    print("layers, lowest first:")
    for k, files in enumerate(layers(graph)):
        print(f"  {k}: {' '.join(files)}")
    print(f"no cycle among {len(graph)} files")


if __name__ == "__main__":
    main()
