"""What a compiled graph depends on in its inputs, and a fast check that a call still matches.

A ``FusedGraph`` is compiled once per input signature (``input_key``): each tensor's sizes,
strides, dtype, device and whether it starts its storage, and the value of each number. The key
is built and hashed on every call, and a model's graph takes every parameter as an input: on an
H100 host (torch 2.11, 2026-11-24) the key and its lookup took 0.69 ms of ResNet-50's 5.7 ms
host step (270 inputs), more than any other part of fuse's own work.

``SignatureCheck`` does the same check for the one signature a graph has been called with, with
no key to build: ``TensorGuards``, the C++ check Dynamo's tensor guards were made of, compares the
dtype, device, dispatch keys, ``requires_grad``, sizes and strides of all the tensors in one call
(24 us for 270 tensors on the development machine, against 258 us to build the key and look it
up, 2026-11-24), and the numbers are compared as a tuple. Whether a tensor starts its storage is
not checked: compiled code reads every input through its own data pointer, at offsets relative
to it, and each launch checks the pointers' alignment (``runtime.Launcher``). A call that does
not match takes the full key, so a new signature still compiles anew; where ``TensorGuards`` is
missing or takes other arguments, every call does.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def input_key(args: Sequence[Any]) -> tuple:
    """What a compiled specialization depends on, for each graph input.

    Computed in one pass with no conversions (``torch.Size`` hashes and compares as the tuple
    it is).
    """
    return tuple([
        (a.shape, a.stride(), a.dtype, a.device, a.storage_offset() == 0) if isinstance(a, torch.Tensor)
        else (type(a), a) if a is None or isinstance(a, (int, float, bool))
        else type(a)
        for a in args
    ])


class SignatureCheck:
    """Whether a call's inputs have the signature of the ``args`` it was made from."""

    def __init__(self, guards: Any, tensor_positions: list[int] | None, others: tuple[tuple[int, Any], ...],
                 count: int) -> None:
        self.guards = guards
        self.tensor_positions = tensor_positions  # None: every input is a tensor
        self.others = others  # (position, value) of each input that is not a tensor
        self.count = count

    @staticmethod
    def make(args: Sequence[Any]) -> SignatureCheck | None:
        """The check for ``args``' signature, or None where it cannot be made here."""
        guards_type = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
        guards_type = getattr(guards_type, "TensorGuards", None)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        others = tuple((k, a) for k, a in enumerate(args) if not isinstance(a, torch.Tensor))
        if guards_type is None or any(not (a is None or type(a) in (int, float, bool)) for _, a in others):
            return None
        try:
            guards = guards_type(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
            if not guards.check(*tensors):
                return None
            if tensors:  # a torch whose check passes what it should not: every call takes the key
                other = torch.empty((tensors[0].dim() + 2) * (1,), dtype=tensors[0].dtype)
                if guards.check(other, *tensors[1:]):
                    return None
        except Exception:  # another torch's signature: every call takes the full key
            return None
        positions = None if not others else [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        return SignatureCheck(guards, positions, others, len(args))

    def matches(self, args: list[Any]) -> bool:
        if len(args) != self.count:
            return False
        if self.tensor_positions is None:
            return self.guards.check(*args)
        for k, value in self.others:
            arg = args[k]
            if type(arg) is not type(value) or arg != value:
                return False
        return self.guards.check(*[args[k] for k in self.tensor_positions])
