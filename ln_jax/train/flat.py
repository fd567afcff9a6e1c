"""The train state as the jitted train step passes it: its arrays in one list.

A jitted function's call flattens its arguments and builds its outputs again, on the host,
before and after the device runs. The train state's parameters and Adam moments are NNX
`Variable`s, each flattened and built again by a Python call, so the host's part of a step grew
with the number of arrays: on this CPU (BERT-base, 629 state arrays, one device; `python
bench/speed/bench_launch.py --size=base`) the step's call returned after 6.6 ms with the state as
nested `nnx.State`s and 3.1 ms with the same arrays in one list. Where the device's step is
short (BERT-tiny to -small on a GPU or TPU) that host time is the step's time.

A `FlatState` is that list and the `Layout` that rebuilds the state dict from it. The train
step (`ln_jax.train.steps.jit_train_step`) takes either and returns a `FlatState`; JAX flattens
one with a single Python call. It reads as the state dict does (`state["params"]`, built on its
first read, for that key only), and `as_tree` gives the dict back for what stores or
compares it whole (checkpoints).

  layout = Layout.of(state)            # state: {"params": nnx.State, "step": array, ...}
  flat = layout.pack(state)            # FlatState: flat.leaves, flat["params"]
  as_tree(flat)                        # the dict again
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

__all__ = ["FlatState", "Layout", "as_tree", "stepping"]


class Layout:
    """The structure of a state dict: its whole tree's definition and, for each top-level key,
    where its arrays lie in the flat list and the definition that rebuilds its value."""

    def __init__(self, treedef: Any, spans: dict[str, tuple[int, int, Any]]):
        self.treedef, self.spans = treedef, spans

    @classmethod
    def of(cls, tree: Mapping[str, Any]) -> Layout:
        """The layout of `tree` (a dict of pytrees: arrays, ShapeDtypeStructs, shardings)."""
        spans, start = {}, 0
        for key in sorted(tree):  # JAX flattens a dict in its keys' order
            count = jax.tree.structure(tree[key]).num_leaves
            spans[key] = (start, start + count, jax.tree.structure(tree[key]))
            start += count
        return cls(jax.tree.structure(dict(tree)), spans)

    def pack(self, tree: Mapping[str, Any]) -> FlatState:
        """`tree` as a FlatState of this layout.

        Raises:
          ValueError: `tree` is not of this structure (names the keys whose trees differ).
        """
        leaves, treedef = jax.tree.flatten(dict(tree))
        if treedef != self.treedef:
            differ = sorted(
                k
                for k in set(tree) | set(self.spans)
                if k not in tree
                or k not in self.spans
                or jax.tree.structure(tree[k]) != self.spans[k][2]
            )
            raise ValueError(
                f"a train state of another structure than the step's (keys that differ: "
                f"{differ}): the step was built for another model, optimizer or config; build "
                "it from this state's pieces (ln_jax.train.steps.jit_train_step)."
            )
        return FlatState(self, leaves)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.treedef == self.treedef

    def __hash__(self) -> int:
        return hash(self.treedef)

    def __repr__(self) -> str:
        return f"Layout({', '.join(f'{k}: {b - a}' for k, (a, b, _) in self.spans.items())})"


class FlatState(Mapping):
    """A state dict's arrays in one list, with the `Layout` that rebuilds it; read as the
    dict (each key's value built on its first read). A pytree whose leaves are `leaves`, with
    what was read since taken from the values read: a trainer's hook that sets a parameter
    (`state["params"][...]["kernel"][...] = x`) changes the next step's input, as it did in
    the nested dict."""

    __slots__ = ("layout", "leaves", "_values")

    def __init__(self, layout: Layout, leaves: list[Any]):
        self.layout, self.leaves, self._values = layout, leaves, {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            start, stop, treedef = self.layout.spans[key]
            self._values[key] = jax.tree.unflatten(treedef, self.leaves[start:stop])
        return self._values[key]

    def current_leaves(self) -> list[Any]:
        """`leaves`, with each key read so far flattened again from its value (a Variable
        set through it counts).

        Raises:
          ValueError: a value read was given another structure (a Variable added or removed).
        """
        if not self._values:
            return self.leaves
        leaves = list(self.leaves)
        for key, value in self._values.items():
            start, stop, treedef = self.layout.spans[key]
            new, structure = jax.tree.flatten(value)
            if structure != treedef:
                raise ValueError(
                    f"state[{key!r}] was changed in structure after it was read (a Variable "
                    "added or removed); a train state keeps its structure: set values only."
                )
            leaves[start:stop] = new
        return leaves

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.spans)

    def __len__(self) -> int:
        return len(self.layout.spans)

    def __repr__(self) -> str:
        return f"FlatState({len(self.leaves)} arrays; {self.layout!r})"


class _Path(str):
    """A leaf's key: its whole path in the state dict, shown as it is (`keystr` writes a key
    with `str`): `['params']['encoder']...['kernel'].value`."""

    def __str__(self) -> str:
        return str.__str__(self)


def _keys(state: FlatState) -> tuple[list[tuple[Any, Any]], Layout]:
    """The leaves with their paths in the state dict (error messages, `tree_flatten_with_path`)."""
    leaves = state.current_leaves()
    tree = jax.tree.unflatten(state.layout.treedef, leaves)  # not cached: nothing "read"
    paths = [
        jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]
    return list(zip(map(_Path, paths), leaves, strict=True)), state.layout


jax.tree_util.register_pytree_with_keys(
    FlatState,
    _keys,
    lambda layout, leaves: FlatState(layout, list(leaves)),
    flatten_func=lambda state: (state.current_leaves(), state.layout),
)


def as_tree(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state dict of `state` (a FlatState: its values as read; or already a dict)."""
    if isinstance(state, FlatState):
        return {key: state[key] for key in state}
    return state


def stepping(fn: Callable, layout: Layout) -> Callable:
    """`fn(state, *args) -> (state, out)` as a function of a FlatState of `layout`, returning
    one (traced: the dict is built and taken apart inside the jitted program, free). Named
    as `fn` (the program's name: `jit_step_fn` in XLA's dumps and profiles)."""

    @functools.wraps(fn)
    def call(state: FlatState, *args: Any) -> tuple[FlatState, Any]:
        new, out = fn(as_tree(state), *args)
        return layout.pack(new), out

    return call
