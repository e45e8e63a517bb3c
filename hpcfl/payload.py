"""Named tensors <-> one flat buffer.

A payload (the model, anchors, a classifier, ...) travels as one contiguous 1-D buffer so that the
transport makes one collective per payload group, never one per tensor. The layout is the law
that ties the two views together: packing is linear, so summing packed buffers equals packing the
summed tensors — which is why a weighted average can be one MPI reduce.
"""
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

import torch

from hpcfl.errors import PayloadError

CHUNK = 2 ** 22         # elements per step of add_into: its float64 temporary stays under 32 MiB


@dataclass(frozen=True)
class Layout:
    """Ordered names and shapes of the tensors in a payload."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> "Layout":
        return cls(tuple(tensors), tuple(tuple(t.shape) for t in tensors.values()))

    def __add__(self, other: "Layout") -> "Layout":
        clash = set(self.names) & set(other.names)
        if clash:
            raise PayloadError(f"payload layouts overlap in {sorted(clash)}: give each tensor one name")
        return Layout(self.names + other.names, self.shapes + other.shapes)

    def select(self, keep) -> "Layout":
        """The entries whose name satisfies `keep(name)`, in order (a parameter-selected payload)."""
        picked = [(n, s) for n, s in zip(self.names, self.shapes, strict=True) if keep(n)]
        return Layout(tuple(n for n, _ in picked), tuple(s for _, s in picked))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(prod(s) for s in self.shapes)

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def _check(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if tuple(tensors) != self.names and set(tensors) != set(self.names):
            raise PayloadError(f"payload has tensors {sorted(tensors)} but the layout declares {sorted(self.names)}")
        for name, shape in zip(self.names, self.shapes, strict=True):
            if tuple(tensors[name].shape) != shape:
                raise PayloadError(f"payload tensor '{name}' has shape {tuple(tensors[name].shape)}, "
                                   f"layout declares {shape}")

    def pack(self, tensors: Mapping[str, torch.Tensor], dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
        """One flat buffer (on the tensors' device) holding `scale * tensors` in layout order."""
        self._check(tensors)
        device = tensors[self.names[0]].device if self.names else "cpu"
        flat = torch.empty(self.numel, dtype=dtype, device=device)
        self.add_into(flat, tensors, scale, checked=True, zero=True)
        return flat

    def add_into(self, flat: torch.Tensor, tensors: Mapping[str, torch.Tensor], scale: float = 1.0,
                 checked: bool = False, zero: bool = False) -> None:
        """flat += scale * pack(tensors), without a temporary buffer (or flat = ... when zero=True)."""
        if not checked:
            self._check(tensors)
        offset = 0
        for name, size in zip(self.names, self.sizes, strict=True):
            src = tensors[name].reshape(-1)
            for start in range(0, size, CHUNK):           # a float32 -> float64 add would copy the whole tensor
                part, piece = flat[offset + start:offset + min(start + CHUNK, size)], src[start:start + CHUNK]
                if zero:
                    part.copy_(piece).mul_(scale)
                else:
                    part.add_(piece.to(flat.device, flat.dtype), alpha=scale)    # CPU scalars beside GPU models
            offset += size

    def unpack(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into `flat`, one per name, in their declared shapes."""
        if flat.dim() != 1 or flat.numel() != self.numel:
            raise PayloadError(f"flat buffer has {flat.numel()} elements, layout needs {self.numel}")
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[offset:offset + size].view(shape)
            offset += size
        return out
