"""What one request's tensors may be, checked from their shapes before any value reaches NumPy or
TensorFlow: the one place where gRPC (TensorProtos and Examples), REST (JSON) and `loopline infer`
check them.

- Rank: at most `max_rank` dimensions (serving.limits.max_tensor_rank). TensorFlow itself takes
  254, but its Python bridge hands a string array of more than 32 dimensions to C++ code sized for
  NumPy 1's 32 and the process dies (SIGSEGV); NumPy 2 stops at 64 with a ValueError.
- Dimensions: none negative (INVALID_ARGUMENT, as TensorShape's check in Tensor::FromProto).
- Elements: all tensors of one request together hold at most `max_elements` values
  (serving.limits.max_request_elements; RESOURCE_EXHAUSTED). Counted from the shapes, with the
  product stopped at the limit: a shape may claim 2^62 x 2^62 elements.
- The signature's TensorSpec (`check_shapes`): the rank, and every dimension the spec knows
  (not -1), must match; TF Serving does not check (its Session feeds any shape) and neither does
  loopline under TF Serving's flags.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from serving.errors import ServingError, invalid, too_large


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class RequestLimits:
    max_rank: int = 32
    max_elements: int = 16 * 1024 * 1024
    check_shapes: bool = True

    @classmethod
    def of(cls, config, tf_serving_rules: bool = False) -> "RequestLimits":
        """From ServingConfig's `limits`; the TensorSpec check follows the start mode unless set."""
        limits = config.limits
        check = limits.check_signature_shapes
        return cls(limits.max_tensor_rank, limits.max_request_elements,
                   (not tf_serving_rules) if check is None else check)

    def budget(self) -> "ElementBudget":
        return ElementBudget(self)


def over_the_element_limit(what: str, limit: int) -> ServingError:
    return too_large(f"{what} more than {limit} values, the limit (serving.limits.max_request_elements)")


class ElementBudget:
    """One request's count of values, taken tensor by tensor."""

    __slots__ = ("max_rank", "left")

    def __init__(self, limits: RequestLimits):
        self.max_rank = limits.max_rank
        self.left = limits.max_elements

    def check_rank(self, name: str, rank: int) -> None:
        if rank > self.max_rank:
            raise invalid(f"input '{name}': {rank} dimensions; a request tensor may have at most "
                          f"{self.max_rank} (serving.limits.max_tensor_rank)")

    def take(self, name: str, shape) -> int:
        """The element count of input `name` of `shape` (a sequence of ints); raises when it
        breaks a limit. (One loop: this runs for every tensor of every request.)"""
        if len(shape) > self.max_rank:
            self.check_rank(name, len(shape))
        count = 1
        for size in shape:
            if size < 0:
                raise invalid(f"input '{name}': negative dimension in shape {_shape_text(shape)}")
            count *= size
            if count > self.left:  # stops at the limit: the product of a hostile shape is huge
                raise over_the_element_limit(f"input '{name}': shape {_shape_text(shape)} has", self.left)
        self.left -= count
        return count

    def take_examples(self, count: int) -> None:
        """Classify/Regress/MultiInference: one serialized string per example."""
        if count > self.left:
            raise over_the_element_limit(f"the request's {count} examples are", self.left)
        self.left -= count


class SpecShape(NamedTuple):
    rank: int
    known: tuple[tuple[int, int], ...]  # (dimension, size) where the spec says a size
    text: str


def signature_shapes(signature) -> dict[str, SpecShape]:
    """Each input's TensorSpec shape, for the inputs whose rank is known; read once per signature
    (reading the proto's fields costs more than the check)."""
    out = {}
    for name, info in signature.inputs.items():
        if not info.tensor_shape.unknown_rank:
            dims = [d.size for d in info.tensor_shape.dim]
            out[name] = SpecShape(len(dims), tuple((i, s) for i, s in enumerate(dims) if s >= 0), _shape_text(dims))
    return out


def check_signature_shapes(wanted: dict[str, SpecShape], inputs) -> None:
    """Each input array's shape against its TensorSpec shape (`signature_shapes`); plain loops,
    as this runs for every input of every request."""
    for name, array in inputs.items():
        spec = wanted.get(name)
        if spec is None:
            continue
        shape = array.shape
        matches = len(shape) == spec.rank
        if matches:
            for dim, size in spec.known:
                if shape[dim] != size:
                    matches = False
                    break
        if not matches:
            raise invalid(f"input '{name}': shape {_shape_text(shape)} does not match the signature's "
                          f"{spec.text} (-1: any size)")
