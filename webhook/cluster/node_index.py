"""What the known nodes can offer, kept up to date as their NodeResourceTopology documents change.

``/validate`` asks "could any candidate node ever admit this pod, and could one admit it now?". The answer depends
only on a node's shape (NUMA nodes, CPU counts, policies: ``NodeTopology.shape_key``) and, for "now", on its free
CPUs (``state_key``). So the index groups the nodes by shape and, within a shape, by free-CPU state, each group
holding the names of its nodes; a question costs one simulation per distinct shape and state instead of a scan of
every node. Within a shape the states are ordered by free CPUs, most first, so "can one admit it now" usually stops
at the first. Nodes are also indexed by label (``key=value`` -> names) for ``nodeSelector``.

``NodeStore`` calls ``put`` / ``delete`` on every change of a node's document or labels (an incremental update,
O(labels of that node)); a relist rebuilds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from allocator.nrt import NodeTopology

__all__ = ["FrozenShapeGroup", "NodeIndex", "ShapeGroup"]


class ShapeGroup:
    """The candidate nodes of one shape: one "ever" answer for all of them."""

    __slots__ = ("_names", "_shape", "node")

    def __init__(self, shape: _Shape, names: set[str] | None, node: NodeTopology) -> None:
        self._shape = shape
        self._names = names
        self.node = node  # one of them

    def states(self) -> Iterator[NodeTopology]:
        """One candidate node per distinct free-CPU state, most free CPUs first (lazily: stop when answered)."""
        names = self._names
        for key in self._shape.order():
            members = self._shape.states[key]
            if names is None:
                yield next(iter(members.values()))
            elif not names.isdisjoint(members):
                yield next(node for n, node in members.items() if n in names)

    def frozen(self) -> FrozenShapeGroup:
        """A copy that the index's later changes leave alone (for a worker thread)."""
        return FrozenShapeGroup(self.node, tuple(self.states()))


class FrozenShapeGroup:
    __slots__ = ("_states", "node")

    def __init__(self, node: NodeTopology, states: tuple[NodeTopology, ...]) -> None:
        self.node = node
        self._states = states

    def states(self) -> Iterator[NodeTopology]:
        return iter(self._states)


class _Shape:
    """The states of one shape: state key -> {name: node}, and the keys ordered by free CPUs (most first)."""

    __slots__ = ("_order", "states")

    def __init__(self) -> None:
        self.states: dict[Any, dict[str, NodeTopology]] = {}
        self._order: list[Any] | None = None

    def add(self, node: NodeTopology) -> None:
        members = self.states.get(node.state_key)
        if members is None:
            members = self.states[node.state_key] = {}
            self._order = None
        members[node.name] = node

    def remove(self, node: NodeTopology) -> None:
        members = self.states.get(node.state_key)
        if members is None:
            return
        members.pop(node.name, None)
        if not members:
            del self.states[node.state_key]
            self._order = None

    def order(self) -> list[Any]:
        if self._order is None:
            self._order = sorted(self.states, key=lambda k: -_free(next(iter(self.states[k].values()))))
        return self._order


def _free(node: NodeTopology) -> int:
    return node.total_available


class NodeIndex:
    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeTopology, tuple[tuple[str, str], ...]]] = {}
        self._shapes: dict[Any, _Shape] = {}
        self._by_label: dict[tuple[str, str], set[str]] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def put(self, node: NodeTopology, labels: Mapping[str, str]) -> None:
        """Index ``node`` (replacing what was indexed under its name) with its effective ``labels``."""
        pairs = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        old = self._nodes.get(node.name)
        if old is not None:
            if old[0] is node and old[1] == pairs:
                return
            self._unindex(old[0], old[1])
        self._nodes[node.name] = (node, pairs)
        shape = self._shapes.get(node.shape_key)
        if shape is None:
            shape = self._shapes[node.shape_key] = _Shape()
        shape.add(node)
        for pair in pairs:
            self._by_label.setdefault(pair, set()).add(node.name)

    def delete(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            self._unindex(old[0], old[1])

    def _unindex(self, node: NodeTopology, pairs: tuple[tuple[str, str], ...]) -> None:
        shape = self._shapes.get(node.shape_key)
        if shape is not None:
            shape.remove(node)
            if not shape.states:
                del self._shapes[node.shape_key]
        for pair in pairs:
            names = self._by_label.get(pair)
            if names is not None:
                names.discard(node.name)
                if not names:
                    del self._by_label[pair]

    def matching(self, selector: Mapping[str, str]) -> set[str]:
        """Names of the nodes whose labels include every ``key: value`` of ``selector`` (non-empty)."""
        sets = []
        for pair in selector.items():
            names = self._by_label.get(pair)
            if not names:
                return set()
            sets.append(names)
        sets.sort(key=len)
        return set(sets[0]).intersection(*sets[1:])

    def groups(self, names: set[str] | None = None) -> list[ShapeGroup]:
        """The shapes of every node (``names`` None) or of the nodes named in ``names`` (a subset of the index)."""
        if names is not None and len(names) >= len(self._nodes):
            names = None  # all of them
        out: list[ShapeGroup] = []
        for shape in self._shapes.values():
            if names is None:
                first = next(iter(shape.states.values()))
                out.append(ShapeGroup(shape, None, next(iter(first.values()))))
                continue
            for members in shape.states.values():
                if not names.isdisjoint(members):
                    node = next(node for n, node in members.items() if n in names)
                    out.append(ShapeGroup(shape, names, node))
                    break
        return out
