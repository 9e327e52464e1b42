"""What lowerings handle: tensor values (``TensorArg``) and the context a lowering builds its
expression in (``LoweringContext``: the output's layout and index, loads of arguments broadcast
to it, ATen's type promotion)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.utils import _pytree as pytree

from fusebackend import indexing, ir, sizevars
from fusebackend.lowering.registry import Unsupported


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A tensor value during lowering: a view of a buffer and a meta tensor with its layout."""

    view: ir.View
    meta: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.view.dtype

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.view.sizes

    def permuted(self, order: Sequence[int]) -> TensorArg:
        """The same elements with the dims in ``order`` (a view, as ``permute``)."""
        v = self.view
        return TensorArg(ir.View(v.buffer, tuple(v.sizes[d] for d in order), tuple(v.strides[d] for d in order),
                                 v.offset), self.meta.permute(*order))


class LoweringContext:
    """What a lowering sees: the output's layout and helpers to read arguments at its index."""

    def __init__(
        self,
        out_meta: torch.Tensor,
        device: torch.device,
        index: Sequence[Any] | None = None,
        sizes: Sequence[Any] | None = None,
    ) -> None:
        """``sizes``: the output's sizes where they are symbolic (``out_meta`` has them at the
        hints)."""
        self.out_meta = out_meta
        self.device = device
        self.sizes = tuple(out_meta.shape) if sizes is None else tuple(sizes)
        self.dtype = out_meta.dtype
        # the output's index: its own loop variables, or (inside a reduction) a given index
        self.vars = tuple(index) if index is not None else indexing.loop_vars("i", len(self.sizes))

    def load(self, arg: TensorArg) -> ir.Expr:
        """``arg`` broadcast to the output's sizes and read at the output's index."""
        view = arg.view
        nd_out, nd = len(self.sizes), len(view.sizes)
        if nd > nd_out:
            raise Unsupported("argument has more dims than the output")
        idx = []
        for k, size in enumerate(view.sizes):
            out_size = self.sizes[nd_out - nd + k]
            if size == 1:
                idx.append(indexing.sympy.Integer(0))
            elif size == out_size:
                idx.append(self.vars[nd_out - nd + k])
            else:
                raise Unsupported(f"cannot broadcast {view.sizes} to {self.sizes}")
        return ir.Load(view, tuple(idx))

    def value(self, arg: Any, dtype: torch.dtype) -> ir.Expr:
        """A tensor argument or a Python scalar as an expression of ``dtype``."""
        if isinstance(arg, TensorArg):
            return ir.cast(self.load(arg), dtype)
        if isinstance(arg, (bool, int, float)):
            return ir.Constant(ir._convert_scalar(arg, dtype), dtype)
        raise Unsupported(f"unsupported argument {type(arg).__name__}")

    @staticmethod
    def result_type(*args: Any) -> torch.dtype:
        """Type promotion of tensors and scalars, exactly as ATen does it."""
        metas = [a.meta if isinstance(a, TensorArg) else a for a in args if a is not None]
        _, result = elementwise_dtypes(
            *metas, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
        )
        return result


def beyond_kernels(args: Any, kwargs: Any, out_meta: Any) -> str | None:
    """Why an op must stay an ATen call whatever its lowering: a tensor kernels cannot hold
    (``ir.KERNEL_DTYPES``), a conjugate or negative bit, or a view to another dtype."""
    ins = [a.meta for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorArg)]
    outs = [t for t in pytree.tree_leaves(out_meta) if isinstance(t, torch.Tensor)]
    for t in ins + outs:
        if t.dtype not in ir.KERNEL_DTYPES:
            return f"a {t.dtype} tensor"
        if t.is_conj() or t.is_neg():
            return "a tensor with a conjugate or negative bit"
    return None


def size_value(size: Any, dtype: torch.dtype) -> ir.Expr:
    """A size (a part's bound, a dim's length) as a value of ``dtype`` in a node's body: a
    constant, or over symbolic sizes an expression the kernel computes from its size arguments."""
    return ir.IndexValue(size, dtype) if sizevars.symbolic([size]) else ir.Constant(size, dtype)


def check_matches(result: Any, out_meta: Any) -> None:
    """A composite must produce exactly the sizes and dtypes ATen's meta function gives."""
    got = pytree.tree_leaves(result)
    want = pytree.tree_leaves(out_meta)
    if len(got) != len(want):
        raise Unsupported("composite lowering returned the wrong number of outputs")
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            # symbolic sizes at the hints, which the meta output was computed at
            if not isinstance(g, TensorArg) or tuple(map(sizevars.size_hint, g.sizes)) != tuple(w.shape) or (
                    g.dtype != w.dtype):
                raise Unsupported(f"composite lowering produced {getattr(g, 'sizes', g)} instead of {tuple(w.shape)} {w.dtype}")
